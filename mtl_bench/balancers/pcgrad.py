"""Yu et al., NeurIPS 2020, "Gradient Surgery for Multi-Task Learning" (PCGrad)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from mtl_bench.balancers.seeded import SeededGenerator
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer
from mtl_bench.gradient_engine.host import host_solution


def pcgrad_weights(gram: np.ndarray, orders: Sequence[Sequence[int]]) -> tuple[np.ndarray, int]:
    """PCGrad in weight space: Σ_i g_i^PC = Σ_j w_j g_j, and the number of projections made.

    g_i^PC = Σ_k c_ik g_k starts at g_i; for each other task j in `orders[i]`, if g_i^PC·g_j = (c_i G)_j < 0
    it loses its component along g_j: c_ij −= (c_i G)_j / G_jj. Only T×T arithmetic (torchjd's
    PCGradWeighting does the same).
    """
    t = gram.shape[0]
    total = np.zeros(t)
    projections = 0
    for i in range(t):
        c = np.zeros(t)
        c[i] = 1.0
        for j in orders[i]:
            if j == i:
                continue
            inner = gram[j] @ c
            if inner < 0.0:
                c[j] -= inner / gram[j, j]
                projections += 1
        total += c
    return total, projections


class PCGradWeighting(Weighting):
    """Projects each task's gradient off the gradients it conflicts with, then sums (Algorithm 1).

    For each task i, in a random order over the other tasks j: if g_i^PC·g_j < 0, g_i^PC −= (g_i^PC·g_j /
    ‖g_j‖²) g_j. The shared parameters get Σ_i g_i^PC; the heads their own gradients (weight 1).
    Computed on the T×T Gramian (see `pcgrad_weights`), so the loops cost nothing next to the backward.

    References: LibMTL 1.1.5 `PCGrad` (which also visits j = i, a no-op, and draws orders with Python's
    `random`) and torchjd 0.18 `PCGrad` (the same orders from `torch.randperm`, which this class draws from
    its own generator: seeded with `seed`, or from the global torch RNG when built, so ranks and resumed
    runs agree; its state is in `state_dict`). The generator advances even on a skipped step.

    Metrics: `weight/<task>` (w with Σ_i g_i^PC = Σ_j w_j g_j), `grad_norm/<task>`, `grad_cos/<a>/<b>`,
    `pcgrad/projections` (pairs projected this step).
    """

    HOST_SOLVE = "the projections on the T×T Gramian (numpy; the orders from a CPU generator)"

    def __init__(self, seed: Optional[int] = None) -> None:
        """
        seed: seed of the generator that orders the projections; None draws one from torch's global RNG.
        """
        super().__init__()
        self.rng = SeededGenerator(seed)

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        t = gram.shape[0]
        orders = [list(torch.randperm(t, generator=self.rng.generator).numpy()) for _ in range(t)]
        return host_solution(gram, "pcgrad/projections", lambda g: pcgrad_weights(g, orders))


class PCGrad(GramianBalancer):
    """PCGrad (`PCGradWeighting`) as a balancer: `balancer=pcgrad`; at the shared parameters, as its reference."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        seed: Optional[int] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        The gradients are taken at the shared parameters only, as in the reference (no grad_source option).
        seed: seed of the generator that orders the projections; None draws one from torch's global RNG.
        """
        super().__init__(task_names, shared_params, PCGradWeighting(seed=seed))
