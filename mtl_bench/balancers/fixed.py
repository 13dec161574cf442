"""Fixed loss weights: the network is trained on sum_k w_k L_k (the standard MTL baseline)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.checks import stack_weights, task_weights
from mtl_bench.gradient_engine.balancer import Balancer, Context, weights_first


class FixedWeights(Balancer):
    """`FixedWeights(["a", "b"], weights={"a": 1.0, "b": 4.0})`: one backward of `1.0 * L_a + 4.0 * L_b`."""

    weights: Tensor

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
        task_names, weights = weights_first(type(self), task_names, weights)
        super().__init__(task_names)
        self.register_buffer("weights", stack_weights(task_weights(weights, self.task_names), self.task_names))

    def backward(
        self,
        losses: dict[str, Tensor],
        shared: Tensor,
        ctx: Context = None,
    ) -> dict[str, Tensor]:
        self.check_losses(losses)
        stacked = torch.stack([losses[name] for name in self.task_names])
        total = (self.weights.to(stacked.dtype) * stacked).sum()
        self.run_backward(total, ctx)
        return {tags.weight(name): self.weights[i] for i, name in enumerate(self.task_names)}

    def backward_task(
        self,
        task: str,
        loss: Tensor,
        shared: Tensor,
        ctx: Context = None,
    ) -> dict[str, Tensor]:
        """Per-task mode: w_task * L_task on its own batch; the accumulated gradients equal the joint sum."""
        if task not in self.task_names:
            raise KeyError(f"task {task!r} is not one of the balancer's tasks {self.task_names}")
        weight = self.weights[self.task_names.index(task)]
        self.run_backward(weight.to(loss.dtype) * loss, ctx)
        return {tags.weight(task): weight}
