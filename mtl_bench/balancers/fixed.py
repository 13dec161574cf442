"""Fixed loss weights: the network is trained on sum_k w_k L_k (the standard MTL baseline)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

from torch import Tensor

from mtl_bench.balancers.checks import stack_weights, task_weights
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.gradient_engine.balancer import weights_first
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer


class ConstantWeighting(LossWeighting):
    """w, the same every step (a buffer, so a checkpoint keeps it). Per-task steps add up to the joint sum."""

    per_task = True
    reads_losses = False
    weights: Tensor

    def __init__(self, weights: Tensor) -> None:
        """
        weights: one weight >= 0 per task, in the balancer's (sorted) task order.
        """
        super().__init__()
        self.register_buffer("weights", weights)

    def forward(self, losses: Tensor) -> Tensor:
        return self.weights


class FixedWeights(LossWeightingBalancer):
    """`FixedWeights(["a", "b"], weights={"a": 1.0, "b": 4.0})`: one backward of `1.0 * L_a + 4.0 * L_b`."""

    def __init__(
        self,
        task_names: Union[Sequence[str], Mapping[str, float], None] = None,
        weights: Optional[Mapping[str, float]] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine); a mapping, or none with weights= given: EnCodec's forms, the
            mapping's keys are the tasks and its values the weights.
        weights: one weight >= 0 per task; None gives every task 1.0.
        """
        names, weights = weights_first(type(self), task_names, weights)
        super().__init__(names, ConstantWeighting(stack_weights(task_weights(weights, names), sorted(names))))
