"""Liu, Johns & Davison, CVPR 2019, "End-to-End Multi-Task Learning with Attention" (dynamic weight average)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.checks import number
from mtl_bench.gradient_engine.balancer import Context
from mtl_bench.gradient_engine.rank_average import average_by_name
from mtl_bench.gradient_engine.staged import JOINT, PER_TASK, StagedBalancer


class DynamicWeightAverage(StagedBalancer):
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

    def __init__(self, task_names: Sequence[str], temperature: float = 2.0, period: int = 100) -> None:
        """
        task_names: the tasks (given by the engine).
        temperature: the softmax temperature T of the paper (> 0; LibMTL: 2.0).
        period: optimizer steps per averaging period (>= 1); the optimizer steps of one epoch reproduce LibMTL.
        """
        super().__init__(task_names)
        self.temperature = number("temperature", temperature, 0, above=True)
        self.period = number("period", period, 1, integer=True)
        n = len(self.task_names)
        self.register_buffer("period_sum", torch.zeros(n))  # Σ items·loss in the current period
        self.register_buffer("period_items", torch.zeros(n))  # Σ items
        self.register_buffer("period_steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("periods", torch.zeros((), dtype=torch.long))  # complete periods so far
        self.register_buffer("last", torch.ones(n))  # L̄(p−1)
        self.register_buffer("before_last", torch.ones(n))  # L̄(p−2)

    def extra_repr(self) -> str:
        return f"tasks={self.task_names}, temperature={self.temperature}, period={self.period}"

    @property
    def rates(self) -> Tensor:
        """r_i = L̄_i(p−1) / L̄_i(p−2) from the committed averages (1 before two periods are complete)."""
        return self.last / self.before_last

    @property
    def weights(self) -> Tensor:
        """The weights of the next step, from the committed averages."""
        soft = len(self.task_names) * torch.softmax(self.rates / self.temperature, dim=-1)
        return torch.where(self.periods >= 2, soft, torch.ones_like(soft))

    @staticmethod
    def _items(shared: Tensor) -> Tensor:
        # A fill on the device, not a host-to-device copy (which would wait for the stream).
        return shared.new_full((), float(shared.shape[0]) if shared.dim() > 0 else 1.0, dtype=torch.float32)

    def _update(self, weighted: Tensor, items: Tensor) -> None:
        """Stage the period sums (and the roll-over at a period's end) from the step's items·loss and items."""
        self._require_finite(weighted)
        total, count = self.period_sum + weighted, self.period_items + items
        steps = self.period_steps + 1
        full = steps >= self.period
        self._stage(
            period_sum=torch.where(full, torch.zeros_like(total), total),
            period_items=torch.where(full, torch.zeros_like(count), count),
            period_steps=torch.where(full, torch.zeros_like(steps), steps),
            periods=self.periods + full.long(),
            last=torch.where(full, total / count, self.last),
            before_last=torch.where(full, self.last, self.before_last),
        )

    def _reduce(self, weighted: Tensor, items: Tensor) -> tuple[Tensor, Tensor]:
        names = self.task_names
        local = {
            **{f"weighted/{n}": weighted[i] for i, n in enumerate(names)},
            **{f"items/{n}": items[i] for i, n in enumerate(names)},
        }
        mean = average_by_name(local)
        return (torch.stack([mean[f"weighted/{n}"] for n in names]), torch.stack([mean[f"items/{n}"] for n in names]))

    def _metrics(self, weights: Tensor, names: Sequence[str]) -> dict[str, Tensor]:
        rates = self.rates
        metrics: dict[str, Tensor] = {}
        for name in names:
            metrics[tags.weight(name)] = weights[self._index[name]]
            metrics[f"dwa/rate/{name}"] = rates[self._index[name]]
        return metrics

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        self.check_losses(losses)
        self._begin(JOINT, ctx, shared)
        ordered = torch.stack([losses[name] for name in self.task_names])
        items = self._items(shared).expand(len(self.task_names))
        weighted, items = self._reduce(ordered.detach().float() * items, items)
        self._update(self._mean("weighted", weighted), self._mean("items", items))
        weights = self.weights
        metrics = self._metrics(weights, self.task_names)  # this step's, before a commit without a context
        self.run_backward((weights * ordered).sum(), ctx)
        self._end_joint()
        return metrics

    def backward_task(self, task: str, loss: Tensor, shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        """Per-task mode: w_task·L_task on the task's own batch; the sums are updated in `step()`."""
        self._begin(PER_TASK, ctx, shared)
        items = self._items(shared)
        self._collect(task, weighted=loss.detach().float() * items, items=items)
        weights = self.weights
        self.run_backward(weights[self._index[task]] * loss, ctx)
        return self._metrics(weights, [task])

    def _finish(self) -> dict[str, Tensor]:
        stats = [self._collected[name] for name in self.task_names]
        self._update(
            *self._reduce(torch.stack([s["weighted"] for s in stats]), torch.stack([s["items"] for s in stats]))
        )
        return {}
