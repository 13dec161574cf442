"""The engine's ValidationSource (balancers/validation_source.py): a bilevel balancer's validation stream, and the
loop's training batch, task losses, parameters and lr.

Made by compose when a balancer that declares `validation` is built (it holds the validation data), connected to
the model, optimizer and precision when the StepRunner is made, told each micro-batch's loader step and training
batch by the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from mtl_bench.balancers.validation_source import Batch
from mtl_bench.config import TrainerConf
from mtl_bench.engine.data import HOLDOUT_STREAM, BatchSource, StepSampler
from mtl_bench.engine.precision import Precision
from mtl_bench.tasks.base import Task


@dataclass
class _Run:
    """What a connected stream reads: the run's model, tasks, precision, optimizer and validation batches."""

    model: nn.Module
    tasks: list[Task]
    precision: Precision
    optimizer: torch.optim.Optimizer
    batches: BatchSource
    params: dict[str, Tensor]


class ValidationStream:
    """`data`: the validation rows (held out of the training split, or the val split; compose.validation_data)."""

    def __init__(self, data: Dataset) -> None:
        self.data = data
        self._run: Optional[_Run] = None
        self._step = 0
        self._batch: Optional[Batch] = None

    def connect(
        self,
        model: nn.Module,
        tasks: list[Task],
        precision: Precision,
        optimizer: torch.optim.Optimizer,
        conf: TrainerConf,
        seed: int,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        """Serve this run: `model` is the one the step forwards (compiled, DDP), each rank takes its slice of a
        global validation batch of batch_size × world_size, as of a training batch."""
        self.close()
        sampler = StepSampler(len(self.data), conf.batch_size * world_size, seed, stream=HOLDOUT_STREAM)  # type: ignore[arg-type]
        batches = BatchSource(self.data, sampler, rank, conf.batch_size, device, conf.num_workers)
        params: dict[str, Tensor] = {name: p for name, p in model.named_parameters() if p.requires_grad}
        self._run = _Run(model, list(tasks), precision, optimizer, batches, params)

    def at_micro_batch(self, loader_step: int) -> None:
        """Set by the runner before each micro-batch: the validation stream's position is the micro-batch's loader
        step, a pure function of the step, so a resumed run draws the same batches."""
        self._step = loader_step

    def set_training_batch(self, batch: Batch) -> None:
        """Set by the runner before each backward: the batch whose losses the balancer receives."""
        self._batch = batch

    def _connected(self) -> _Run:
        if self._run is None:
            raise RuntimeError("the validation stream is not connected to a run (StepRunner connects it)")
        return self._run

    # ValidationSource

    def training_batch(self) -> Batch:
        if self._batch is None:
            raise RuntimeError("no training batch yet: the runner sets it before each backward")
        return self._batch

    def next_validation_batch(self) -> Batch:
        batch = self._connected().batches.batch(self._step)
        self._step += 1
        return batch

    def task_losses(
        self, inputs: Any, targets: dict[str, Tensor], params: Optional[Mapping[str, Tensor]] = None
    ) -> dict[str, Tensor]:
        """Each task's loss (float32, under the precision's autocast); with `params`, of the model at those
        parameters on copies of its buffers (a bilevel method's look-ahead forwards leave BatchNorm's running
        statistics alone)."""
        run = self._connected()
        with run.precision.autocast():
            if params is None:
                out = run.model(inputs)
            else:
                buffers = {name: b.clone() for name, b in run.model.named_buffers()}
                out = torch.func.functional_call(run.model, {**buffers, **params}, (inputs,))
        return {t.name: t.loss(out.preds[t.name].float(), targets[t.name]) for t in run.tasks}

    def trainable_parameters(self) -> dict[str, Tensor]:
        return self._connected().params

    def learning_rate(self) -> float:
        return float(self._connected().optimizer.param_groups[0]["lr"])

    def close(self) -> None:
        """Stop the validation loader's worker processes (a run that stops or ends)."""
        if self._run is not None:
            self._run.batches.close()
