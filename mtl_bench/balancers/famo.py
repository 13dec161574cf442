"""Liu, Feng, Stone & Liu, NeurIPS 2023, "FAMO: Fast Adaptive Multitask Optimization"."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.adam_update import adam_update
from mtl_bench.balancers.checks import at_least, number, pair
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer


class FAMOWeighting(LossWeighting):
    """Task logits ξ (start at 0), z = softmax(ξ); the network descends Σ_i z_i log D_i / c with
    D_i = L_i − min_i + loss_eps and c = Σ_i z_i / D_i held constant: one backward of Σ_i w_i L_i with
    w_i = z_i / (c·D_i). ξ learns from how much each log-loss fell over a step:
    δ_i = log D_i(before) − log D_i(after), ξ ← Adam(ξ, J_softmax(ξ)ᵀ δ + γ ξ) (γ: Adam's L2 weight decay).

    Reference: Cranial-XIX/FAMO `famo.py` (`FAMO.get_weighted_loss`, `FAMO.update`; commit
    0a6ad06dbdd55fce73ec01e3a175c2498cd1e5e9; LibMTL main's FAMO is the same algorithm). Their loop, after
    `optimizer.step()`, runs a second forward on the same batch and calls `update(new_losses)`, so the
    logits of step t+1 learn from L(θ_{t+1}) on batch t. Here there is one forward and one backward per
    step: step t+1's own losses L(θ_{t+1}) on batch t+1 serve as the "after" losses of step t, so each
    step first applies the update (δ = log D(L_t) − log D(L_{t+1})) and then weights its losses with the
    new logits. The order of operations is theirs (update ξ_t → ξ_{t+1}, then weight step t+1 with
    z(ξ_{t+1})), so when every step sees the same batch (full-batch training, as in `famo.py`'s example)
    the parameters equal theirs exactly; with mini-batches δ also carries the change of batch (a noisier
    estimate of the same decrease, for no extra forward). The first step has no "before" and leaves ξ
    at 0 (theirs too: no update precedes step 1). Their `max_norm` clip of the shared parameters'
    gradient is left to the engine's clipping (`trainer.grad_clip.max_norm`, over all parameters).

    Under accumulation each micro-batch applies the update and the weights from the mean of the step's
    losses so far (the last micro-batch's are those of the whole step, which is what is committed);
    under DDP the losses are averaged across ranks (by name) first, so every rank holds the same ξ and
    the weights are those of the global batch. Per-task mode is not supported: a task's weight needs c
    and the update, which need every task's loss of the same step.

    Metrics: `weight/<task>` (w_i), `famo/z/<task>` (z_i). ξ, Adam's moments, the previous step's losses
    and `min_losses` are buffers.
    """

    logits: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    opt_step: Tensor
    prev_losses: Tensor
    has_prev: Tensor
    min_losses: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        lr: float,
        gamma: float,
        betas: tuple[float, float],
        eps: float,
        min_losses: list[float],
        loss_eps: float,
    ) -> None:
        """Options as `FAMO`'s, checked there; `task_names` and `min_losses` in the balancer's (sorted) order."""
        super().__init__()
        self.task_names, self.lr, self.gamma, self.betas = list(task_names), lr, gamma, betas
        self.eps, self.loss_eps = eps, loss_eps
        n = len(self.task_names)
        self.register_buffer("logits", torch.zeros(n))
        self.register_buffer("exp_avg", torch.zeros(n))
        self.register_buffer("exp_avg_sq", torch.zeros(n))
        self.register_buffer("opt_step", torch.zeros(()))
        self.register_buffer("prev_losses", torch.zeros(n))
        self.register_buffer("has_prev", torch.tensor(False))
        self.register_buffer("min_losses", torch.tensor(min_losses))

    def extra_repr(self) -> str:
        return f"lr={self.lr}, gamma={self.gamma}"

    def _log_gap(self, losses: Tensor) -> Tensor:
        return torch.log(losses - self.min_losses + self.loss_eps)

    def update(self, losses: Tensor, items: Tensor) -> dict[str, Tensor]:
        """ξ_{t+1} (and its Adam moments) from the committed ξ_t, the previous step's losses and these."""
        return self._next(losses)

    def _next(self, losses: Tensor) -> dict[str, Tensor]:
        xi = self.logits
        delta = self._log_gap(self.prev_losses) - self._log_gap(losses)
        z = torch.softmax(xi, dim=-1)
        grad = z * (delta - (z * delta).sum()) + self.gamma * xi  # J_softmax(ξ)ᵀ δ, plus Adam's L2 term
        new, exp_avg, exp_avg_sq, step = adam_update(
            xi, grad, self.exp_avg, self.exp_avg_sq, self.opt_step, self.lr, self.betas, self.eps
        )
        first = ~self.has_prev  # no "before" losses yet: no update
        return {
            "logits": torch.where(first, xi, new),
            "exp_avg": torch.where(first, self.exp_avg, exp_avg),
            "exp_avg_sq": torch.where(first, self.exp_avg_sq, exp_avg_sq),
            "opt_step": torch.where(first, self.opt_step, step),
            "prev_losses": losses,
            "has_prev": torch.ones_like(self.has_prev),
        }

    def forward(self, losses: Tensor) -> Solution:
        """w_i = z_i / (c·D_i) with z = softmax(ξ_{t+1}): the step's update comes first (as theirs)."""
        z = torch.softmax(self._next(losses)["logits"], dim=-1)
        gap = losses - self.min_losses + self.loss_eps
        weights = z / ((z / gap).sum() * gap)
        return Solution(weights, metrics={f"famo/z/{name}": z[i] for i, name in enumerate(self.task_names)})


class FAMO(LossWeightingBalancer):
    """FAMO (`FAMOWeighting`) as a balancer: `balancer=famo`."""

    def __init__(
        self,
        task_names: Sequence[str],
        lr: float = 0.025,
        gamma: float = 0.001,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        min_losses: Optional[Mapping[str, float]] = None,
        loss_eps: float = 1e-8,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        lr: the learning rate of the logits' Adam (> 0; FAMO: 0.025).
        gamma: the logits' L2 weight decay (>= 0; FAMO's run scripts: 0.001 on NYUv2, CelebA and QM9, 0.01 on
            CityScapes).
        betas: Adam's betas for the logits, each in [0, 1).
        eps: Adam's eps for the logits (> 0).
        min_losses: each task's lowest attainable loss min_i (FAMO's set_min_losses); None gives 0 for every task.
        loss_eps: added to L_i − min_i before the log (> 0; FAMO: 1e-8).
        """
        names = sorted(task_names)
        minima = [0.0] * len(names)
        if min_losses is not None:
            if set(min_losses) != set(names):
                raise ValueError(f"min_losses: tasks {sorted(min_losses)} do not match the tasks {names}")
            minima = [float(min_losses[name]) for name in names]
        weighting = FAMOWeighting(
            names,
            number("lr", lr, 0, above=True),
            at_least("gamma", gamma, 0),
            pair("betas", betas, 0, 1, below=True),
            number("eps", eps, 0, above=True),
            minima,
            number("loss_eps", loss_eps, 0, above=True),
        )
        super().__init__(task_names, weighting)
