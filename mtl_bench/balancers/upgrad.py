"""Quinton & Rey, 2024, "Jacobian Descent for Multi-Objective Optimization" (UPGrad)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np
from torch import Tensor

from mtl_bench.balancers.checks import at_least
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer
from mtl_bench.gradient_engine.host import host_solution
from mtl_bench.gradient_engine.solvers import dual_cone_weights


def upgrad_weights(gram: np.ndarray, norm_eps: float, reg_eps: float) -> tuple[np.ndarray, int]:
    """Σ_i of the weights of g_i/T projected onto the dual cone of all rows, and the number of (i, j) whose
    weight the projection raised (constraints that were active)."""
    t = gram.shape[0]
    trace = np.trace(gram)
    normalized = np.zeros_like(gram) if trace < norm_eps else gram / trace
    regularized = normalized + reg_eps * np.eye(t)
    rows = dual_cone_weights(regularized, np.eye(t) / t)  # row i: the projection of g_i / T
    return rows.sum(0), int((rows > np.eye(t) / t + 1e-12).sum())


class UPGradWeighting(Weighting):
    """Unconflicting projection of gradients: each g_i (weighted 1/T) is projected onto the dual cone of all
    task gradients, {x: g_j·x ≥ 0 for all j}, and the projections are summed.

    In weight space (the paper's Proposition 1) the projection of Jᵀu is Jᵀv with v = argmin vᵀGv subject to
    v ≥ u, on the Gramian normalised by its trace (`norm_eps`: below that trace G is taken as 0) plus
    `reg_eps`·I; solved exactly by an active-set method (`solvers.nonneg_qps`), T problems of size T.

    Reference: torchjd 0.18 `UPGrad` (default preference 1/T, quadprog solver) and LibMTL main `UPGrad`
    (the same code). The heads get their own gradients (weight 1), as torchjd's mtl_backward gives them.

    Metrics: `weight/<task>`, `grad_norm/<task>`, `grad_cos/<a>/<b>`, `upgrad/active` (how many of the T² dual
    cone constraints were active: 0 when no two gradients conflict).
    """

    HOST_SOLVE = "T active-set QPs on the T×T Gramian (numpy)"

    def __init__(self, norm_eps: float = 1e-4, reg_eps: float = 1e-4) -> None:
        """
        norm_eps: a Gramian whose trace is below this (>= 0) counts as zero.
        reg_eps: added to the normalised Gramian's diagonal (>= 0) so the QP is strictly convex.
        """
        super().__init__()
        self.norm_eps, self.reg_eps = at_least("norm_eps", norm_eps, 0), at_least("reg_eps", reg_eps, 0)

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        return host_solution(gram, "upgrad/active", lambda g: upgrad_weights(g, self.norm_eps, self.reg_eps))


class UPGrad(GramianBalancer):
    """UPGrad (`UPGradWeighting`) as a balancer: `balancer=upgrad`; at the shared parameters, as its reference."""

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
        super().__init__(task_names, shared_params, UPGradWeighting(norm_eps=norm_eps, reg_eps=reg_eps))
