"""The engine's ValidationSource (balancers/validation_source.py): a bilevel balancer's validation stream, and the
loop's training batch, task losses, parameters and lr.

Made by compose when a balancer that declares `validation` is built (it holds the validation data); a callback of
the loop, which connects it to the run's step runner, model, optimizer and precision at set-up and closes its loader
at the end. It reads the micro-batch being trained on from the runner (`loader_step`, `batch`) when the balancer
asks, so the step itself does no work for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional

import torch
from torch import Tensor
from torch.utils.data import Dataset

from mtl_bench.balancers.validation_source import Batch
from mtl_bench.engine.callbacks import Callback
from mtl_bench.engine.data import HOLDOUT_STREAM, BatchSource, StepSampler

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import Recipe
    from mtl_bench.engine.step import StepRunner


@dataclass
class _Run:
    """What a connected stream reads: the run's step runner, optimizer and validation batches."""

    runner: StepRunner
    optimizer: torch.optim.Optimizer
    batches: BatchSource
    params: dict[str, Tensor]


class ValidationStream(Callback):
    """`data`: the validation rows (held out of the training split, or the val split; compose.validation_data)."""

    def __init__(self, data: Dataset) -> None:
        self.data = data
        self._run: Optional[_Run] = None
        self._at = -1  # the runner's count of micro-batches when the stream last drew
        self._step = 0  # the validation stream's position

    def setup(self, run: Recipe) -> None:
        self.connect(run.runner, run.optimizer)

    def teardown(self, run: Recipe) -> None:
        self.close()

    def connect(self, runner: StepRunner, optimizer: torch.optim.Optimizer) -> None:
        """Serve the run `runner` steps: the model it forwards (compiled, DDP), each rank its slice of a global
        validation batch of batch_size × world_size, as of a training batch; `optimizer`'s lr."""
        self.close()
        conf, rows = runner.conf, len(self.data)  # type: ignore[arg-type]
        sampler = StepSampler(rows, conf.batch_size * runner.world_size, runner.seed, stream=HOLDOUT_STREAM)
        batches = BatchSource(self.data, sampler, runner.rank, conf.batch_size, runner.device, conf.num_workers)
        params: dict[str, Tensor] = {n: p for n, p in runner.model.named_parameters() if p.requires_grad}
        self._run = _Run(runner, optimizer, batches, params)
        self._at = -1

    def _connected(self) -> _Run:
        if self._run is None:
            raise RuntimeError("the validation stream is not connected to a run (the loop connects it at set-up)")
        return self._run

    # ValidationSource

    def training_batch(self) -> Batch:
        batch = self._connected().runner.batch
        if batch is None:
            raise RuntimeError("no training batch yet: the runner sets it before each backward")
        return batch

    def next_validation_batch(self) -> Batch:
        """The stream's position is the micro-batch's loader step, then one on per draw within it: a pure function
        of the step, so a resumed run draws the same batches."""
        run = self._connected()
        if run.runner.micro_batches != self._at:  # a new micro-batch: back to its loader step
            self._at, self._step = run.runner.micro_batches, run.runner.loader_step
        batch = run.batches.batch(self._step)
        self._step += 1
        return batch

    def task_losses(
        self, inputs: Any, targets: dict[str, Tensor], params: Optional[Mapping[str, Tensor]] = None
    ) -> dict[str, Tensor]:
        """Each task's loss (float32, under the precision's autocast); with `params`, of the model at those
        parameters on copies of its buffers (a bilevel method's look-ahead forwards leave BatchNorm's running
        statistics alone)."""
        runner = self._connected().runner
        with runner.precision.autocast():
            if params is None:
                out = runner.model(inputs)
            else:
                buffers = {name: b.clone() for name, b in runner.model.named_buffers()}
                out = torch.func.functional_call(runner.model, {**buffers, **params}, (inputs,))
        return {t.name: t.loss(out.preds[t.name].float(), targets[t.name]) for t in runner.taskset.tasks}

    def trainable_parameters(self) -> dict[str, Tensor]:
        return self._connected().params

    def learning_rate(self) -> float:
        return float(self._connected().optimizer.param_groups[0]["lr"])

    def close(self) -> None:
        """Stop the validation loader's worker processes (a run that stops or ends)."""
        if self._run is not None:
            self._run.batches.close()
