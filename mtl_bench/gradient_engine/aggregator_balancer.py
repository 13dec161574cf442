"""An aggregator as a balancer: the direction an `Aggregator` makes of the gradient blocks, written to `.grad`."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.aggregator import Aggregation, Aggregator
from mtl_bench.balancers.weighting import check_solution
from mtl_bench.errors import ContractError
from mtl_bench.gradient_engine.balancer import refuse_flat_state
from mtl_bench.gradient_engine.gradient_balancer import GradientBalancer
from mtl_bench.gradient_engine.gramian import gram_metrics
from mtl_bench.gradient_engine.leaf_grads import write_leaf_grads


class AggregatorBalancer(GradientBalancer):
    """d = aggregator(J) at the shared parameters (the contract: mtl_bench/balancers/aggregator.py).

    The gradient engine (`GradientBalancer`) does the rest: the per-task gradients, the loss scale, accumulation,
    per-task steps, the heads. A method of mtl-bench is a subclass whose constructor, written in the method's file,
    builds its aggregator; its state is saved under `aggregator.`. `grad_norm/` and `grad_cos/` come from the
    Gramian, computed only at steps whose measurements are read (`BackwardContext.measure`).
    """

    aggregator: Aggregator

    def __init__(
        self, task_names: Sequence[str], shared_params: Optional[Iterable[Tensor]], aggregator: Aggregator
    ) -> None:
        super().__init__(task_names, shared_params, "shared_params")
        self.aggregator = aggregator

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        refuse_flat_state(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def aggregate(
        self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor, shared: Optional[Tensor]
    ) -> dict[str, Tensor]:
        result = self.aggregator(blocks, scale, losses)
        if not isinstance(result, Aggregation) or len(result.direction) != len(blocks):
            raise ContractError(
                f"{self.part_name} returned {type(result).__name__}; the contract: an Aggregation with one direction "
                f"per block ({len(blocks)})"
            )
        check_solution(result.solution, len(self.task_names), None, blocks[0], self.part_name)
        if result.solution.state:
            self._stage(**{f"aggregator.{name}": value for name, value in result.solution.state.items()})
        write_leaf_grads(list(zip(self._params, result.direction)))
        metrics = {tags.weight(n): v for n, v in zip(self.task_names, result.solution.weights.unbind())}
        if self.measuring:
            metrics.update(gram_metrics(self._unscaled_gramian(blocks, scale), self.task_names))
        metrics.update(result.solution.metrics)
        return metrics
