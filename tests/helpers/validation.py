"""A ValidationSource (mtl_bench/balancers/validation_source.py) for a model outside the engine, as a library user's own
loop writes one: the test hands it each step's training and validation batches."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Batch = tuple[Any, dict[str, Tensor]]


class GivenBatches:
    """`task_losses(inputs, targets, params=None)` and the parameters by name as given; `lr`: a number or the
    optimizer whose first group's lr is read. `feed` sets the step's training batch and validation batch."""

    def __init__(
        self,
        task_losses: Callable[..., dict[str, Tensor]],
        params: dict[str, Tensor],
        lr: float | torch.optim.Optimizer,
    ) -> None:
        self._task_losses, self.params, self.lr = task_losses, params, lr
        self.batch: Optional[Batch] = None
        self.validation: Optional[Batch] = None

    def feed(self, batch: Batch, validation: Batch) -> GivenBatches:
        self.batch, self.validation = batch, validation
        return self

    def training_batch(self) -> Batch:
        assert self.batch is not None, "feed the step's batches first"
        return self.batch

    def next_validation_batch(self) -> Batch:
        assert self.validation is not None, "feed the step's batches first"
        return self.validation

    def task_losses(
        self, inputs: Any, targets: dict[str, Tensor], params: Optional[Mapping[str, Tensor]] = None
    ) -> dict[str, Tensor]:
        return self._task_losses(inputs, targets, params)

    def trainable_parameters(self) -> dict[str, Tensor]:
        return self.params

    def learning_rate(self) -> float:
        lr = self.lr.param_groups[0]["lr"] if isinstance(self.lr, torch.optim.Optimizer) else self.lr
        return float(lr)


def model_batches(model: nn.Module, tasks: Iterable[str], lr: float | torch.optim.Optimizer) -> GivenBatches:
    """Each task's MSE of `model`'s prediction (at `params` by torch.func.functional_call when given), and the
    model's parameters that require grad."""
    tasks = list(tasks)

    def task_losses(x: Any, y: dict[str, Tensor], params: Optional[Mapping[str, Tensor]] = None) -> dict[str, Tensor]:
        out = model(x) if params is None else torch.func.functional_call(model, dict(params), (x,))
        return {t: F.mse_loss(out.preds[t], y[t]) for t in tasks}

    return GivenBatches(task_losses, {n: p for n, p in model.named_parameters() if p.requires_grad}, lr)
