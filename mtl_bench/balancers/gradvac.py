"""Wang et al., ICLR 2021, "Gradient Vaccine: Investigating and Improving Multi-task Optimization in Massively
Multilingual Models" (GradVac)."""

from __future__ import annotations

from functools import partial
from typing import Iterable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from mtl_bench.balancers.checks import number, one_of
from mtl_bench.balancers.seeded import SeededGenerator
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer
from mtl_bench.gradient_engine.host import nan_weights, to_device

GROUPS = ("whole_model", "all_matrix")


def gradvac_weights(
    gram: np.ndarray, targets: np.ndarray, beta: float, orders: Sequence[Sequence[int]], eps: float = 1e-8
) -> tuple[np.ndarray, np.ndarray, int]:
    """One group's GradVac in weight space: (w with Σ_i g_i^vac = Σ_j w_j g_j, the new EMA targets φ̂, the
    number of corrections).

    g_i^vac = Σ_k c_ik g_k starts at g_i; for each other task j in `orders[i]`: φ = cos(g_i^vac, g_j); if
    φ < φ̂_ij, g_i^vac += w g_j with w = ‖g_i^vac‖(φ̂√(1−φ²) − φ√(1−φ̂²)) / (‖g_j‖√(1−φ̂²)), which raises the
    cosine to φ̂; then φ̂_ij ← (1−β)φ̂_ij + βφ (always, as the paper and LibMTL main; 1.1.5 only on a
    correction). Dot products and norms come from the Gramian (as torchjd's GradVacWeighting).
    """
    t = gram.shape[0]
    c = np.eye(t)
    new_targets = targets.copy()
    corrections = 0
    for i in range(t):
        c_gram = c[i] @ gram
        for j in orders[i]:
            norm_i = np.sqrt(max(c_gram @ c[i], 0.0))
            norm_j = np.sqrt(max(gram[j, j], 0.0))
            phi = c_gram[j] / (norm_i * norm_j + eps)
            target = new_targets[i, j]
            if phi < target:
                root_phi, root_target = np.sqrt(max(1 - phi * phi, 0.0)), np.sqrt(max(1 - target * target, 0.0))
                w = norm_i * (target * root_phi - phi * root_target) / (norm_j * root_target + eps)
                c[i, j] += w
                c_gram = c_gram + w * gram[j]
                corrections += 1
            new_targets[i, j] = (1 - beta) * target + beta * phi
    return c.sum(0), new_targets, corrections


class GradVacWeighting(Weighting):
    """Gradient vaccine: for each pair of tasks, when the cosine of their gradients falls below its running
    target φ̂_ij (an EMA of the observed cosines, decay `beta`), task i's gradient gets the amount of g_j that
    brings the cosine up to φ̂_ij; the corrected gradients are summed (`gradvac_weights`). PCGrad is the
    case φ̂ = 0 with no EMA. `group`: one target per pair for all shared parameters (whole_model) or one per
    shared parameter tensor (all_matrix).

    References: LibMTL main `GradVac` (groups whole_model/all_layer/all_matrix, EMA updated every pair) and
    torchjd 0.18 `GradVac` (whole model, the same algorithm on the Gramian, orders from `torch.randperm`,
    which this class draws from its own seeded generator as PCGrad does). LibMTL 1.1.5 `GradVac` updates
    the EMA only on a correction (so φ̂ can only decrease): a bug this class does not copy; its first step
    agrees. The targets are a buffer (checkpointed; a skipped step leaves them), the generator's state is
    in `state_dict` too. The heads get their own gradients (weight 1).

    Metrics: `weight/<task>` (w, averaged over groups), `grad_norm/<task>`, `grad_cos/<a>/<b>`,
    `gradvac/corrections`.
    """

    HOST_SOLVE = "the pairwise corrections on the T×T Gramian (numpy; the orders from a CPU generator)"

    targets: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        blocks: int,
        beta: float = 0.5,
        group: str = "whole_model",
        seed: Optional[int] = None,
    ) -> None:
        """
        task_names: the tasks, sorted (given by the engine).
        blocks: the number of blocks of J, one per shared parameter tensor (given by the engine).
        beta: the EMA rate of the cosine targets, in [0, 1] (the paper's 0.01; LibMTL's default 0.5).
        group: whole_model (one target per task pair) or all_matrix (one per pair and shared parameter tensor).
        seed: seed of the generator that orders the corrections; None draws one from torch's global RNG.
        """
        super().__init__()
        self.beta, self.group = number("beta", beta, 0, 1), one_of("group", group, GROUPS)
        self.rng = SeededGenerator(seed)
        self.per_block = group == "all_matrix"
        groups = 1 if group == "whole_model" else blocks
        t = len(task_names)
        self.register_buffer("targets", torch.zeros(groups, t, t))

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        t = gram.shape[-1]
        others = [np.array([j for j in range(t) if j != i]) for i in range(t)]
        orders = [others[i][torch.randperm(t - 1, generator=self.rng.generator).numpy()] for i in range(t)]
        grams = gram if self.per_block else gram[None]  # per block: (K, T, T)
        host = grams.detach().to("cpu", torch.float64).numpy()  # one host copy (a sync on a GPU)
        if not np.isfinite(host).all():
            return Solution(
                nan_weights(t, gram), metrics={"gradvac/corrections": torch.full((), float("nan"), device=gram.device)}
            )
        targets = self.targets.detach().to("cpu", torch.float64).numpy()
        weights, new_targets, corrections = [], np.empty_like(targets), 0
        for k in range(len(host)):
            w, new_targets[k], n = gradvac_weights(host[k], targets[k], self.beta, orders)
            weights.append(w)
            corrections += n
        return Solution(
            to_device(np.stack(weights) if self.per_block else weights[0], gram),
            metrics={"gradvac/corrections": torch.tensor(float(corrections), device=gram.device)},
            state={"targets": to_device(new_targets, self.targets)},
        )


class GradVac(GramianBalancer):
    """GradVac (`GradVacWeighting`) as a balancer: `balancer=gradvac`; at the shared parameters, as its reference."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        beta: float = 0.5,
        group: str = "whole_model",
        seed: Optional[int] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        The gradients are taken at the shared parameters only, as in the reference (no grad_source option).
        beta: the EMA rate of the cosine targets, in [0, 1] (the paper's 0.01; LibMTL's default 0.5).
        group: whole_model (one target per task pair) or all_matrix (one per pair and shared parameter tensor).
        seed: seed of the generator that orders the corrections; None draws one from torch's global RNG.
        """
        super().__init__(task_names, shared_params, partial(GradVacWeighting, beta=beta, group=group, seed=seed))
