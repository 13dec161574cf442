"""One optimizer step's forwards and backwards (seed 001's multi-batch processor).

joint: each micro-batch carries every task's targets; per_task: each task has its own sample stream and
each micro-batch is one batch per task, forwarded and backpropagated in turn. Gradients accumulate over
`grad_accumulation_steps` micro-batches (and over the tasks in per-task mode); the optimizer steps once.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Mapping, Optional

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from mtl_bench.balancers import BackwardContext, Balancer
from mtl_bench.config import TrainerConf
from mtl_bench.engine.data import BatchSource, StepSampler, task_split
from mtl_bench.engine.diagnostics import GradientDiagnostics
from mtl_bench.engine.precision import Precision
from mtl_bench.tasks.base import TaskSet

log = logging.getLogger("mtl_bench")


@dataclass
class StepResult:
    """What one optimizer step's forwards and backwards give the loop, on the device."""

    losses: Tensor  # (T,) each task's loss, mean over the step's micro-batches, detached float32
    measurements: dict[str, Tensor]  # the balancer's, keyed by TensorBoard tag


def resolve_accumulation(conf: TrainerConf, balancer: Balancer) -> int:
    """trainer.grad_accumulation_steps; when not given (null), set in `conf` to what the balancer takes (said in
    one log line where that is more than 1), else 1. Asked once, before anything counts steps per epoch."""
    if conf.grad_accumulation_steps is None:
        needed = balancer.needed_accumulation_steps()
        conf.grad_accumulation_steps = needed or 1  # the run's one value from here on
        if conf.grad_accumulation_steps != 1:
            log.info(
                "trainer.grad_accumulation_steps=%d: %s takes %d micro-batches per optimizer step (set by the "
                "balancer, as trainer.grad_accumulation_steps was not given)",
                needed,
                type(balancer).__name__,
                needed,
            )
    return conf.grad_accumulation_steps


def optimizer_steps_per_epoch(conf: TrainerConf, n_train: int, world_size: int = 1) -> int:
    """Optimizer steps per pass over the training split (per task stream in per-task mode): global batches
    of batch_size × world_size, grad_accumulation_steps of them per step (resolve_accumulation sets it first)."""
    if conf.grad_accumulation_steps is None:
        raise ValueError("trainer.grad_accumulation_steps: null until resolve_accumulation(conf, balancer) sets it")
    return max(1, n_train // (conf.batch_size * world_size) // conf.grad_accumulation_steps)


def samples_per_epoch(taskset: TaskSet) -> int:
    """Samples of the training split; multi-input: of the largest task's (LibMTL's epoch for Office: as many
    steps as the largest domain has batches, the smaller ones cycling through theirs)."""
    train = taskset.train
    splits = train.values() if isinstance(train, Mapping) else [train]
    return max(len(split) for split in splits)  # type: ignore[arg-type]


class StepRunner:
    """Runs the forwards and backwards of optimizer step `step`; the caller zeroes grads and steps the optimizer.

    `model` may be DistributedDataParallel: every backward but the step's last runs under `no_sync`, so the
    gradients are all-reduced once. Each rank takes its slice of a global batch of batch_size × world_size,
    so N ranks with batch b see the same samples as one process with batch N·b.
    """

    def __init__(
        self,
        model: nn.Module,
        taskset: TaskSet,
        balancer: Balancer,
        precision: Precision,
        conf: TrainerConf,
        seed: int,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        """Each micro-batch's loader step and training batch stay readable (`loader_step`, `batch`) while its
        backward runs: a bilevel balancer's validation stream (engine/validation.py) reads them there."""
        self.model, self.taskset, self.balancer = model, taskset, balancer
        self.seed, self.device, self.rank, self.world_size = seed, device, rank, world_size
        self.loader_step, self.micro_batches = 0, 0  # the micro-batch being trained on; how many have begun
        self.batch: Optional[tuple[Any, dict[str, Tensor]]] = None
        self.precision, self.conf = precision, conf
        self.k = resolve_accumulation(conf, balancer)
        self.ctx = BackwardContext(precision.scaler, 1.0, self.k)
        global_batch = conf.batch_size * world_size
        splits: list[Dataset]
        if conf.step_mode == "per_task":  # stream i + 1 draws task i's batches (from its own data if multi-input)
            splits = [task_split(taskset.train, t.name) for t in taskset.tasks]
            streams = list(range(1, len(splits) + 1))
        else:
            # not multi-input (the recipe checked)
            splits, streams = [taskset.train], [0]  # type: ignore[list-item]
        self.sources = [
            BatchSource(
                split,
                StepSampler(len(split), global_batch, seed, stream=s),  # type: ignore[arg-type]
                rank,
                conf.batch_size,
                device,
                conf.num_workers,
            )
            for split, s in zip(splits, streams)
        ]
        self.steps_per_epoch = optimizer_steps_per_epoch(conf, samples_per_epoch(taskset), world_size)
        self.on_first_losses: Optional[Callable[[list[Tensor]], None]] = None  # detect_anomalous_params

    def close(self) -> None:
        """Stop the training loaders' worker processes (a run that stops or ends)."""
        for source in self.sources:
            source.close()

    def _sync(self, last: bool) -> ContextManager[Any]:
        no_sync = getattr(self.model, "no_sync", None)  # DDP only
        return contextlib.nullcontext() if last or no_sync is None else no_sync()

    def _guard(self, losses: list[Tensor]) -> None:
        """Set this micro-batch's backward factor: 1/k, or NaN when a loss is not finite, so that every
        gradient is and the step is skipped on the device, with no host sync to decide it."""
        finite = torch.isfinite(torch.stack(losses)).all()
        self.ctx.factor = torch.where(finite, 1.0 / self.k, float("nan"))
        if self.on_first_losses is not None:
            self.on_first_losses(losses)
            self.on_first_losses = None

    def run(self, step: int, diagnostics: Optional[GradientDiagnostics] = None, measure: bool = True) -> StepResult:
        """`diagnostics`: measure each task's gradient of the last micro-batch as well (one extra backward each).
        `measure`: whether this step's measurements will be read (False lets the balancer skip work done for them)."""
        tasks = self.taskset.tasks
        totals: list[Tensor] = []
        metrics: dict[str, Tensor] = {}
        self.ctx.epoch = step // self.steps_per_epoch
        self.ctx.measure = measure
        for j in range(self.k):
            self.loader_step = loader_step = step * self.k + j
            self.micro_batches += 1
            if self.conf.step_mode == "joint":
                self.batch = inputs, targets = self.sources[0].batch(loader_step)
                with self._sync(last=j == self.k - 1):
                    with self.precision.autocast():
                        out = self.model(inputs)
                    # Losses in float32 whatever the autocast dtype; backward outside autocast.
                    losses = {t.name: t.loss(out.preds[t.name].float(), targets[t.name]) for t in tasks}
                    self._guard(list(losses.values()))
                    if diagnostics is not None and j == self.k - 1:
                        for name, loss in losses.items():
                            diagnostics.record(name, loss)
                    metrics = self.balancer.backward(losses, out.shared, self.ctx)
                totals.append(torch.stack([losses[t.name].detach() for t in tasks]))
                continue
            per_task = []
            for i, task in enumerate(tasks):
                self.batch = inputs, targets = self.sources[i].batch(loader_step)
                with self._sync(last=j == self.k - 1 and i == len(tasks) - 1):
                    with self.precision.autocast():
                        out = self.model(inputs, tasks=[task.name])
                    loss = task.loss(out.preds[task.name].float(), targets[task.name])
                    self._guard([loss])
                    if diagnostics is not None and j == self.k - 1:
                        diagnostics.record(task.name, loss)
                    metrics |= self.balancer.backward_task(task.name, loss, out.shared, self.ctx)
                per_task.append(loss.detach())
            totals.append(torch.stack(per_task))
        if diagnostics is not None:
            metrics = {**diagnostics.measurements(), **metrics}  # a balancer's own measurements win
        return StepResult(torch.stack(totals).float().mean(0), metrics)
