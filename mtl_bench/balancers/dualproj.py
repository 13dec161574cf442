"""Lopez-Paz & Ranzato, NeurIPS 2017, "Gradient Episodic Memory for Continual Learning", Eq. 11 (DualProj)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np
from torch import Tensor

from mtl_bench.balancers.checks import at_least
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer
from mtl_bench.gradient_engine.host import host_solution
from mtl_bench.gradient_engine.solvers import dual_cone_weights


def dualproj_weights(gram: np.ndarray, u: np.ndarray, norm_eps: float, reg_eps: float) -> tuple[np.ndarray, int]:
    """The weights of Jᵀu projected onto the dual cone of J's rows, and how many of the T constraints the
    projection made active (raised the weight above u)."""
    t = gram.shape[0]
    trace = np.trace(gram)
    normalized = np.zeros_like(gram) if trace < norm_eps else gram / trace
    weights = dual_cone_weights(normalized + reg_eps * np.eye(t), u)
    return weights, int((weights > u + 1e-12).sum())


class DualProjWeighting(Weighting):
    """The mean gradient Σ_i g_i/T projected onto the dual cone {x: g_j·x ≥ 0 for all j}, so no task's loss
    rises to first order. One projection where UPGrad sums T (one per task gradient); in weight space
    v = argmin vᵀGv subject to v ≥ 1/T, on the Gramian normalised by its trace plus `reg_eps`·I.

    Reference: torchjd 0.18 `DualProj` (mean preference, quadprog projector with norm_eps = reg_eps = 1e-4).
    The heads get their own gradients (weight 1), as torchjd's mtl_backward gives them.

    Metrics: `weight/<task>`, `grad_norm/<task>`, `grad_cos/<a>/<b>`, `dualproj/active` (the number of tasks
    whose constraint the projection made active: 0 when the mean gradient conflicts with none).
    """

    HOST_SOLVE = "an active-set QP on the T×T Gramian (numpy)"

    def __init__(self, norm_eps: float = 1e-4, reg_eps: float = 1e-4) -> None:
        """
        norm_eps: a Gramian whose trace is below this (>= 0) counts as zero.
        reg_eps: added to the normalised Gramian's diagonal (>= 0) so the QP is strictly convex.
        """
        super().__init__()
        self.norm_eps, self.reg_eps = at_least("norm_eps", norm_eps, 0), at_least("reg_eps", reg_eps, 0)

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        u = np.full(gram.shape[0], 1.0 / gram.shape[0])
        return host_solution(gram, "dualproj/active", lambda g: dualproj_weights(g, u, self.norm_eps, self.reg_eps))


class DualProj(GramianBalancer):
    """DualProj (`DualProjWeighting`) as a balancer: `balancer=dualproj`; at the shared parameters, as its reference."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        norm_eps: float = 1e-4,
        reg_eps: float = 1e-4,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        The gradients are taken at the shared parameters only, as in the reference (no grad_source option).
        norm_eps: a Gramian whose trace is below this (>= 0) counts as zero.
        reg_eps: added to the normalised Gramian's diagonal (>= 0) so the QP is strictly convex.
        """
        super().__init__(task_names, shared_params, DualProjWeighting(norm_eps=norm_eps, reg_eps=reg_eps))
