"""Scale-invariant loss Σ_i log L_i, the "SI" baseline of Navon et al., ICML 2022, "Multi-Task Learning as a
Bargaining Game" (Nash-MTL), Section 6."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

from torch import Tensor

from mtl_bench.balancers.checks import stack_weights, task_weights
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.gradient_engine.balancer import weights_first
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer


class ScaleInvariantWeighting(LossWeighting):
    """Trains on Σ_i c_i log L_i: each task's gradient divided by its own loss (w_i = c_i / L_i), so scaling a
    loss by a constant does not change the update. The losses must be positive.

    Reference: AvivNavon/nash-mtl `methods/weight_methods.py` `ScaleInvariantLinearScalarization`
    (`task_weights` c, 1 each by default; commit cce1840). Per-task mode is supported: w_i needs L_i only.

    Metrics: `weight/<task>` (c_i / L_i).
    """

    per_task = True
    task_scales: Tensor

    def __init__(self, task_scales: Tensor) -> None:
        """
        task_scales: the c_i, one per task in sorted task order.
        """
        super().__init__()
        self.register_buffer("task_scales", task_scales)

    def forward(self, losses: Tensor) -> Tensor:
        return self.task_scales / losses  # ∂/∂L_i of Σ_i c_i log L_i


class ScaleInvariant(LossWeightingBalancer):
    """SI (`ScaleInvariantWeighting`) as a balancer: `balancer=si`."""

    def __init__(
        self,
        task_names: Union[Sequence[str], Mapping[str, float], None] = None,
        weights: Optional[Mapping[str, float]] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine); a mapping, or none with weights= given: EnCodec's forms, the
            mapping's keys are the tasks and its values the weights.
        weights: the c_i of Σ_i c_i log L_i, one >= 0 per task; None gives every task 1.0 (the paper).
        """
        names, weights = weights_first(type(self), task_names, weights)
        scales = stack_weights(task_weights(weights, names), sorted(names))  # the balancer's rows: sorted
        super().__init__(names, ScaleInvariantWeighting(scales))
