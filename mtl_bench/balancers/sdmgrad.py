"""Xiao, Ban & Ji, NeurIPS 2023, "Direction-oriented Multi-objective Learning: Simple and Provable Stochastic
Algorithms" (SDMGrad)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.checks import number
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.multi_batch import MultiBatchBalancer, project_to_simplex


class SDMGradWeighting(Weighting):
    """Stochastic direction-oriented MGDA: the weights w solve, by `n_iter` steps of projected SGD with momentum
    (learning rate `lr`, momentum 0.5, restarted every step from the last w), min_w ½ wᵀAw + λ wᵀA w̃ on the
    simplex, A = J_ξ J_ξ'ᵀ from two independent batches normalised by the squared mean of √diag(A), w̃ = 1/T; the
    update on a third batch ζ is d = J_ζᵀ(w + λ w̃)/(1 + λ), between the min-norm direction and the mean gradient.
    The three batches are the micro-batches of gradient accumulation (trainer.grad_accumulation_steps=3): ξ, ξ', ζ
    in that order, so that ζ's Jacobian is never taken (`MultiBatchBalancer`).

    Reference: LibMTL main `SDMGrad` (commit 4336804; λ = 0.3, 20 iterations, SGD lr 5, momentum 0.5); torchjd
    0.18 `SDMGradWeighting` is the same solve with lr 10, and takes ζ last as here. LibMTL takes ζ first (its
    batches ζ, ξ, ξ'): the draws are independent, so only the order of the data stream differs (the test feeds
    LibMTL's). LibMTL sums the three batches' head gradients; here the heads get their mean (what accumulation
    gives). w is a buffer.

    Metrics: `weight/<task>` ((w + λ w̃)/(1 + λ)), `grad_norm/<task>`, `grad_cos/<a>/<b>` (of ξ''s gradients).
    """

    w: Tensor

    def __init__(self, tasks: int, lambda_: float, n_iter: int, lr: float, momentum: float) -> None:
        """Options as `SDMGrad`'s, checked there; `tasks`: their number."""
        super().__init__()
        self.lambda_, self.n_iter, self.lr, self.momentum = lambda_, n_iter, lr, momentum
        self.register_buffer("w", torch.full((tasks,), 1.0 / tasks))

    def extra_repr(self) -> str:
        return f"lambda_={self.lambda_}, n_iter={self.n_iter}, lr={self.lr}"

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        """`gram`: A = J_ξ J_ξ'ᵀ of the step's first two draws."""
        scale = gram.diagonal().clamp(min=0).sqrt().mean()
        a = gram / (scale**2 + 1e-8)
        pull = self.lambda_ * a.mean(dim=1)  # λ A w̃ with w̃ = 1/T
        w, velocity = self.w, None
        for _ in range(self.n_iter):
            grad = a @ w + pull
            velocity = grad if velocity is None else self.momentum * velocity + grad
            w = project_to_simplex(w - self.lr * velocity)
        return Solution((w + self.lambda_ / len(w)) / (1 + self.lambda_), state={"w": w})


class SDMGrad(MultiBatchBalancer):
    """SDMGrad (`SDMGradWeighting`) on the micro-batches as its draws: `balancer=sdmgrad`."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        lambda_: float = 0.3,
        n_iter: int = 20,
        lr: float = 5.0,
        momentum: float = 0.5,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        lambda_: λ >= 0, the pull towards the mean gradient.
        n_iter: projected SGD steps of the inner solve per step (>= 1).
        lr: the inner solve's learning rate (> 0; LibMTL 5, torchjd 10).
        momentum: the inner solve's momentum in [0, 1).
        """
        weighting = SDMGradWeighting(
            len(task_names),
            float(number("lambda_", lambda_, 0)),
            number("n_iter", n_iter, 1, integer=True),
            float(number("lr", lr, 0, above=True)),
            float(number("momentum", momentum, 0, 1, below=True)),
        )
        super().__init__(task_names, shared_params, weighting, batches=(3,))
