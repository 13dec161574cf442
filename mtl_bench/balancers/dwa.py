"""Liu, Johns & Davison, CVPR 2019, "End-to-End Multi-Task Learning with Attention" (dynamic weight average)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.checks import number
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer


class DynamicWeightAverageWeighting(LossWeighting):
    """w_i = T·softmax(r / temperature)_i with r_i = L̄_i(p−1) / L̄_i(p−2), the rate at which each task's
    average training loss fell over the last two complete periods; w_i = 1 until two periods are complete.

    The paper and LibMTL average over epochs; a balancer does not know where an epoch ends, so the
    average is over `period` optimizer steps: set `period` to the number of optimizer steps per epoch and
    the weights are LibMTL's exactly. L̄_i(p) is the item-weighted mean of the step losses in period p
    (LibMTL: Σ batch_size·loss / Σ batch_size over the epoch's batches), the batch size read from the
    first dimension of the shared representation (1 when it is 0-d). Steps count committed optimizer
    steps: a skipped step adds nothing and does not advance the period.

    Reference: LibMTL 1.1.5 `LibMTL.weighting.DWA` (unchanged on main; T = 2.0), from the MTAN code.
    LibMTL averages in float64 on the host; here float32 on the device.

    Metrics: `weight/<task>`, `dwa/rate/<task>` (r_i; 1 until two periods are complete). Under
    accumulation a step's loss is the mean over its micro-batches; under DDP the (items·loss, items)
    sums are averaged across ranks by name, so every rank holds the same averages. The running sums and
    the last two period averages are buffers.
    """

    period_sum: Tensor
    period_items: Tensor
    period_steps: Tensor
    periods: Tensor
    last: Tensor
    before_last: Tensor
    per_task = True  # w_i comes from the committed averages

    def __init__(self, task_names: Sequence[str], temperature: float, period: int) -> None:
        """
        task_names: the tasks, in the balancer's (sorted) order.
        temperature: the softmax temperature (> 0).
        period: optimizer steps per averaging period (>= 1).
        """
        super().__init__()
        self.task_names, self.temperature, self.period = list(task_names), temperature, period
        tasks = len(self.task_names)
        self.register_buffer("period_sum", torch.zeros(tasks))  # Σ items·loss in the current period
        self.register_buffer("period_items", torch.zeros(tasks))  # Σ items
        self.register_buffer("period_steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("periods", torch.zeros((), dtype=torch.long))  # complete periods so far
        self.register_buffer("last", torch.ones(tasks))  # L̄(p−1)
        self.register_buffer("before_last", torch.ones(tasks))  # L̄(p−2)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, period={self.period}"

    def forward(self, losses: Tensor) -> Solution:
        """The weights from the committed averages (the step's losses enter them at its update)."""
        rates = self.last / self.before_last  # r_i = L̄_i(p−1) / L̄_i(p−2): 1 before two periods are complete
        soft = len(rates) * torch.softmax(rates / self.temperature, dim=-1)
        weights = torch.where(self.periods >= 2, soft, torch.ones_like(soft))
        return Solution(weights, metrics={f"dwa/rate/{name}": rates[i] for i, name in enumerate(self.task_names)})

    def update(self, losses: Tensor, items: Tensor) -> dict[str, Tensor]:
        """The period sums (and the roll-over at a period's end) from the step's items·loss and items."""
        total, count = self.period_sum + losses * items, self.period_items + items
        steps = self.period_steps + 1
        full = steps >= self.period
        return {
            "period_sum": torch.where(full, torch.zeros_like(total), total),
            "period_items": torch.where(full, torch.zeros_like(count), count),
            "period_steps": torch.where(full, torch.zeros_like(steps), steps),
            "periods": self.periods + full.long(),
            "last": torch.where(full, total / count, self.last),
            "before_last": torch.where(full, self.last, self.before_last),
        }


class DynamicWeightAverage(LossWeightingBalancer):
    """DWA (`DynamicWeightAverageWeighting`) as a balancer: `balancer=dwa`."""

    def __init__(self, task_names: Sequence[str], temperature: float = 2.0, period: int = 100) -> None:
        """
        task_names: the tasks (given by the engine).
        temperature: the softmax temperature T of the paper (> 0; LibMTL: 2.0).
        period: optimizer steps per averaging period (>= 1); the optimizer steps of one epoch reproduce LibMTL.
        """
        temperature = number("temperature", temperature, 0, above=True)
        period = number("period", period, 1, integer=True)
        super().__init__(task_names, DynamicWeightAverageWeighting(sorted(task_names), temperature, period))
