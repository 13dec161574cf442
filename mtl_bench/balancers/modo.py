"""Chen, Fernando, Ying & Chen, NeurIPS 2023 (JMLR 2024), "Three-Way Trade-Off in Multi-Objective Learning:
Optimization, Generalization and Conflict-Avoidance" (MoDo)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.checks import number
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.multi_batch import MultiBatchBalancer, project_to_simplex


class MoDoWeighting(Weighting):
    """Multi-objective gradient with double sampling: the weights λ take one projected step on the min-norm
    objective, with the Gramian estimated without bias from two independent batches,
    λ ← Π_simplex(λ − γ (J₁ J₂ᵀ λ + ρ λ)), and the update is d = J₃ᵀλ on a third batch (3 micro-batches, as
    LibMTL and the official code with three_grads) or d = ½(J₁ + J₂)ᵀλ (2 micro-batches, the paper's Eq. 2.9b).
    The batches are the micro-batches of gradient accumulation: trainer.grad_accumulation_steps=3 (or 2).

    Reference: LibMTL main `MoDo` (commit 4336804; defaults γ = 0.001, ρ = 0.1), the official code's projection;
    torchjd 0.18 `MoDoWeighting` is the same λ step (its defaults γ = 0.1, ρ = 0.1). The heads get the mean of
    their micro-batch gradients, as LibMTL (which divides their summed gradients by 3). λ is a buffer.

    Metrics: `weight/<task>` (λ), `grad_norm/<task>`, `grad_cos/<a>/<b>` (of the second micro-batch's gradients).
    """

    lambdas: Tensor

    def __init__(self, tasks: int, gamma: float, rho: float) -> None:
        """Options as `MoDo`'s, checked there; `tasks`: their number."""
        super().__init__()
        self.gamma, self.rho = gamma, rho
        self.register_buffer("lambdas", torch.full((tasks,), 1.0 / tasks))

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, rho={self.rho}"

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        """`gram`: A = J₁J₂ᵀ of the step's first two draws."""
        lam = self.lambdas
        lam = project_to_simplex(lam - self.gamma * (gram @ lam + self.rho * lam))
        return Solution(lam, state={"lambdas": lam})


class MoDo(MultiBatchBalancer):
    """MoDo (`MoDoWeighting`) on the micro-batches as its draws: `balancer=modo`."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        gamma: float = 0.001,
        rho: float = 0.1,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        gamma: the step γ of λ (> 0).
        rho: the L2 term ρ of λ's step (>= 0).
        """
        gamma, rho = float(number("gamma", gamma, 0, above=True)), float(number("rho", rho, 0))
        super().__init__(task_names, shared_params, MoDoWeighting(len(task_names), gamma, rho), batches=(2, 3))
