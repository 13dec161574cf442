"""Zhou et al., NeurIPS 2022, "On the Convergence of Stochastic Multi-Objective Gradient Manipulation and Beyond"
(CR-MOGM)."""

from __future__ import annotations

from functools import partial
from typing import Callable, Iterable, Literal, Optional, Sequence, Union

import torch
from torch import Tensor

from mtl_bench.balancers.checks import number
from mtl_bench.balancers.upgrad import UPGradWeighting
from mtl_bench.balancers.weighting import Solution, Weighting, as_solution, build_weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer


class CRMOGMWeighting(Weighting):
    """Correlation-reduced MOGM: the weights λ̂_k that a weighting (`base`) computes at step k are smoothed by an
    exponential moving average, λ_k = α λ_{k−1} + (1 − α) λ̂_k with λ_0 = λ̂_1, and d = Σ_i λ_k,i g_i.
    The smoothing reduces the correlation between the weights and the mini-batch's noise, which is what the
    paper's convergence proof needs.

    Reference: torchjd 0.18 `CRMOGMWeighting` wrapped around a Gramian weighting (e.g. `UPGradWeighting`). The
    base is a config node (`balancer.base._target_=mtl_bench.balancers.mgda.MGDAWeighting`); it must be a
    stateless weighting of whole gradients (MGDA, UPGrad, DualProj, ConFIG, Krum, ...; one with state of its own,
    per-block weights or head weights is refused). λ and whether it has started are buffers. The heads get their
    own gradients (weight 1), as torchjd's mtl_backward gives them.

    Metrics: the base's metrics, with `weight/<task>` the smoothed λ and `cr_mogm/raw/<task>` the base's λ̂.
    """

    HOST_SOLVE = "the wrapped weighting's host solve (UPGrad's QPs by default)"

    lambdas: Tensor
    started: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        listed_tasks: Sequence[str],
        blocks: int,
        base: Union[Weighting, Callable[..., Weighting], None] = None,
        alpha: float = 0.9,
    ) -> None:
        """
        task_names: the tasks, sorted (given by the engine).
        listed_tasks: the tasks in the task set's order (given by the engine, for the base).
        blocks: the number of blocks of J (given by the engine, for the base).
        base: the wrapped weighting, a config node (`_target_`, with `_partial_: true` when it takes task_names);
            null: UPGrad's with its defaults.
        alpha: the EMA's weight α in [0, 1] on the previous λ (0: the base unchanged).
        """
        super().__init__()
        self.task_names = list(task_names)
        try:
            self.base = build_weighting(base or UPGradWeighting, task_names, blocks, listed_tasks, key="base")
        except ValueError as error:  # the base's own option, as base.<option>
            raise ValueError(str(error) if str(error).startswith("base:") else f"base.{error}") from None
        name = type(self.base).__name__
        if self.base.state_dict():  # buffers or a generator: updates this wrapper would never commit
            raise ValueError(f"base: {name} has state of its own ({', '.join(self.base.state_dict())})")
        self.HOST_SOLVE = self.base.HOST_SOLVE
        if self.base.weighs_heads or self.base.per_block:
            raise ValueError(f"base: {name} does not weight whole task gradients with unit head weights")
        self.alpha = number("alpha", alpha, 0, 1)
        self.register_buffer("lambdas", torch.zeros(len(self.task_names)))
        self.register_buffer("started", torch.tensor(False))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        raw = as_solution(self.base(gram, losses))
        previous = torch.where(self.started, self.lambdas, raw.weights)
        smoothed = self.alpha * previous + (1 - self.alpha) * raw.weights
        metrics = dict(raw.metrics)
        metrics.update({f"cr_mogm/raw/{name}": v for name, v in zip(self.task_names, raw.weights.unbind())})
        return Solution(
            smoothed, metrics=metrics, state={"lambdas": smoothed, "started": torch.ones_like(self.started)}
        )


class CRMOGM(GramianBalancer):
    """CR-MOGM (`CRMOGMWeighting`) as a balancer: `balancer=cr_mogm`."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        grad_source: Literal["shared_params", "shared_rep"] = "shared_params",
        base: Union[Weighting, Callable[..., Weighting], None] = None,
        alpha: float = 0.9,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        grad_source: shared_params (exact per-task gradients) or shared_rep (at the shared representation).
        base: the wrapped weighting, a config node (`_target_`, with `_partial_: true` when it takes task_names);
            null: UPGrad's with its defaults.
        alpha: the EMA's weight α in [0, 1] on the previous λ (0: the base unchanged).
        """
        super().__init__(task_names, shared_params, partial(CRMOGMWeighting, base=base, alpha=alpha), grad_source)
