"""Priority-Constrained Descent: "Not All Objectives Are Born Equal: Priority-Constrained Descent for Hierarchical
Multi-Objective Optimization", TMLR 2026 (PCD)."""

from __future__ import annotations

from functools import partial
from typing import Iterable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from mtl_bench.balancers.checks import at_least, number, one_of
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer
from mtl_bench.gradient_engine.host import host_gramian, nan_weights, to_device
from mtl_bench.gradient_engine.solvers import nonneg_qp

PRECISION = 10 * float(np.finfo(np.float32).eps)  # the relative precision of a float32 Gramian (torchjd's bound)


def pcd_weights(gram: np.ndarray, scales: np.ndarray, tau: float) -> tuple[np.ndarray, bool]:
    """The weights of PCD's direction on the raw gradients (primary first in `gram`) and whether the
    secondary constraints could all be met.

    With g̃_i = s_i g_i, the closest d to g̃_1 with g̃_jᵀd ≥ τ‖g̃_j‖² (j ≥ 2) is d = g̃_1 + Σ_j μ_j g̃_j, μ the
    solution of the dual min_{μ ≥ 0} ½ μᵀ G̃_ss μ − μᵀ(τ diag G̃_ss − G̃_s1) (`nonneg_qp`). If the constraints
    cannot hold together (the dual has no minimum) d = g̃_1. d is rescaled to ‖g_1‖; 0 when g_1 = 0 or d ≈ 0.
    """
    t = gram.shape[0]
    weights = np.zeros(t)
    if not gram[0, 0] > 0:
        return weights, True
    scaled = gram * np.outer(scales, scales)
    w = np.zeros(t)
    w[0] = 1.0
    feasible = True
    if t > 1:
        secondary = scaled[1:, 1:]
        try:
            mu = nonneg_qp(secondary, scaled[1:, 0] - tau * np.diag(secondary))
            d_dot = secondary @ mu + scaled[1:, 0]  # g̃_jᵀd
            feasible = bool(np.isfinite(mu).all() and (d_dot >= tau * np.diag(secondary) - 1e-6 * scaled.max()).all())
        except np.linalg.LinAlgError:
            feasible = False
        if feasible:
            w[1:] = np.clip(mu, 0, None)
    sq_norm = w @ scaled @ w
    magnitude = (np.abs(w) @ np.sqrt(np.diag(scaled))) ** 2
    if sq_norm > PRECISION * magnitude:
        weights = w * scales * np.sqrt(gram[0, 0] / sq_norm)
    return weights, feasible


class PCDWeighting(Weighting):
    """The update stays as close as possible to the primary task's gradient while every other task gets at
    least a fraction τ of the first-order progress of a step along its own normalised gradient:
    d̃ = argmin ½‖d − g̃_p‖² subject to g̃_jᵀd ≥ τ‖g̃_j‖², g̃_i = g_i/√(v̂_i + ε) with v̂_i the bias-corrected EMA
    (decay β) of ‖g_i‖²; d̃ is rescaled to ‖g_p‖. Solved in weight space on the Gramian (`pcd_weights`).

    Reference: torchjd 0.18 `PCD` (Goldfarb-Idnani dual active set there; here Lawson-Hanson on the same dual,
    the same minimiser; primary = the first row). The EMA and its step count are buffers, updated from the
    rank-averaged Gramian. The heads get their own gradients (weight 1), as torchjd's mtl_backward gives them.

    Metrics: `weight/<task>`, `grad_norm/<task>`, `grad_cos/<a>/<b>`, `pcd/feasible` (1 when every secondary
    constraint could be met, else 0 and d follows the primary gradient alone).
    """

    HOST_SOLVE = "a non-negative QP on the T×T Gramian (numpy)"

    sq_norm_ema: Tensor
    steps: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        listed_tasks: Sequence[str],
        primary: Optional[str] = None,
        tau: float = 0.02,
        beta: float = 0.999,
        eps: float = 1e-8,
    ) -> None:
        """
        task_names: the tasks, sorted (given by the engine).
        listed_tasks: the tasks in the task set's order (given by the engine).
        primary: the primary task; null: the task set's first task.
        tau: the fraction τ in [0, 1] of normalised progress guaranteed to every other task.
        beta: the decay β in [0, 1) of the EMA of the squared gradient norms.
        eps: ε >= 0, added to the EMA before its inverse square root.
        """
        super().__init__()
        order, names = list(listed_tasks), list(task_names)
        if primary is None:
            primary = order[0]
        self.primary, self.tau = one_of("primary", primary, order), number("tau", tau, 0, 1)
        self.beta, self.eps = number("beta", beta, 0, 1, below=True), at_least("eps", eps, 0)
        p = names.index(primary)
        self._order = [p] + [i for i in range(len(names)) if i != p]  # primary first
        self.register_buffer("sq_norm_ema", torch.zeros(len(names), dtype=torch.float64))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def extra_repr(self) -> str:
        return f"primary={self.primary}, tau={self.tau}"

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        g = host_gramian(gram)
        if g is None:
            return Solution(nan_weights(gram.shape[0], gram), metrics={"pcd/feasible": gram.new_full((), np.nan)})
        steps = int(self.steps) + 1  # a host read of the step count (the solve is on the host anyway)
        ema = self.beta * self.sq_norm_ema.detach().cpu().numpy() + (1 - self.beta) * np.diag(g)
        denominators = np.sqrt(ema / (1 - self.beta**steps) + self.eps)
        scales = np.divide(1.0, denominators, out=np.zeros_like(denominators), where=denominators > 0)
        order = np.array(self._order)
        ordered, feasible = pcd_weights(g[np.ix_(order, order)], scales[order], self.tau)
        weights = np.zeros_like(ordered)
        weights[order] = ordered
        return Solution(
            to_device(weights, gram),
            metrics={"pcd/feasible": gram.new_tensor(float(feasible))},
            state={"sq_norm_ema": torch.as_tensor(ema).to(self.sq_norm_ema), "steps": self.steps + 1},
        )


class PCD(GramianBalancer):
    """PCD (`PCDWeighting`) as a balancer: `balancer=pcd`; at the shared parameters, as its reference."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        primary: Optional[str] = None,
        tau: float = 0.02,
        beta: float = 0.999,
        eps: float = 1e-8,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        The gradients are taken at the shared parameters only, as in the reference (no grad_source option).
        primary: the primary task; null: the task set's first task.
        tau: the fraction τ in [0, 1] of normalised progress guaranteed to every other task.
        beta: the decay β in [0, 1) of the EMA of the squared gradient norms.
        eps: ε >= 0, added to the EMA before its inverse square root.
        """
        super().__init__(task_names, shared_params, partial(PCDWeighting, primary=primary, tau=tau, beta=beta, eps=eps))
