"""The engine of every Gramian method: a `Weighting` of the Gramian of the per-task gradients, as a balancer."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Literal, Optional, Sequence, Union

import torch
from torch import Tensor

from mtl_bench.balancers.weighting import (
    Solution,
    Weighting,
    as_solution,
    build_weighting,
    qualified_name,
    shown,
)
from mtl_bench.errors import ContractError
from mtl_bench.gradient_engine.balancer import refuse_flat_state
from mtl_bench.gradient_engine.gradient_balancer import GradientBalancer
from mtl_bench.gradient_engine.gramian import gramian
from mtl_bench.gradient_engine.rank_average import rank_mean

PREFIX = "weighting."


class GramianBalancer(GradientBalancer):
    """d = Σ_i w_i g_i with w given by a `Weighting` of G = J Jᵀ (the contract: mtl_bench/balancers/weighting.py).

    The gradient engine (`GradientBalancer`) does the rest: the per-task gradients at the shared parameters or the
    shared representation, the loss scale, accumulation, per-task steps, DDP, the heads. A user's weighting runs
    from config as `balancer=gramian balancer.weighting._target_=my_lab.MyWeighting`. A method of mtl-bench is
    a subclass whose constructor, written in the method's file, takes the weighting's options and builds it
    (`UPGrad(tasks, params, norm_eps=1e-4)`, `balancer.norm_eps=...`).

    The weighting's buffers are this balancer's state under `weighting.` (`weighting.alpha`); its options and
    state are read on the weighting (`balancer.weighting.alpha`).
    """

    weighting: Weighting

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        weighting: Union[Weighting, Callable[..., Weighting], None] = None,
        grad_source: Literal["shared_params", "shared_rep"] = "shared_params",
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        weighting: the Weighting, or a config node naming one (`_target_`; `_partial_: true` when its constructor
            takes task_names or blocks, which the engine then supplies).
        grad_source: shared_params (exact per-task gradients) or shared_rep (gradients at the shared
            representation: one small backward per task, exact where that representation is a cut).
        """
        listed = list(task_names)
        super().__init__(task_names, shared_params, grad_source)
        if weighting is None:
            raise ValueError("weighting: needs a Weighting (a config node with its _target_)")
        blocks = len(self._params) if grad_source == "shared_params" else 1
        self.weighting = build_weighting(weighting, self.task_names, blocks, listed)
        self.heads_wait = self.weighting.weighs_heads
        self.HOST_SOLVE = self.weighting.HOST_SOLVE  # the weighting's

    def extra_repr(self) -> str:
        return f"tasks={self.task_names}, grad_source={self.grad_source}"

    def _step_gramian(self, blocks: Sequence[Tensor], scale: Optional[Tensor]) -> Optional[Tensor]:
        if not self.weighting.per_block:
            return self._unscaled_gramian(blocks, scale)
        grams = torch.stack([gramian([block]) for block in blocks])
        self._block_grams = rank_mean(grams / (scale * scale) if scale is not None else grams)
        return self._block_grams.sum(0)

    @property
    def part_name(self) -> str:
        """A method of mtl-bench is the balancer; under balancer=gramian the weighting is the user's part."""
        if type(self) is not GramianBalancer:
            return super().part_name
        return f"balancer.weighting ({qualified_name(self.weighting)})"

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        refuse_flat_state(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _solve(self, gram: Tensor, losses: Tensor) -> Solution:
        solution = as_solution(self.weighting(self._block_grams if self.weighting.per_block else gram, losses))
        if solution.state:
            buffers = self.weighting._buffers
            for name, value in solution.state.items():
                kept = buffers.get(name)
                if kept is None or not isinstance(value, Tensor) or value.shape != kept.shape:
                    wanted = (
                        f"shape {tuple(kept.shape)}" if kept is not None else f"one of {sorted(buffers) or '(none)'}"
                    )
                    raise ContractError(
                        f"{self.part_name} returned state {name!r} {shown(value)}; the contract: a new value of one "
                        f"of its buffers, {wanted}"
                    )
            self._stage(**{PREFIX + name: value for name, value in solution.state.items()})
        return solution
