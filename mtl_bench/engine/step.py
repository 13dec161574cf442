"""One optimizer step's forwards and backwards (seed 001's multi-batch processor).

joint: each micro-batch carries every task's targets; per_task: each task has its own sample stream and
each micro-batch is one batch per task, forwarded and backpropagated in turn. Gradients accumulate over
`grad_accumulation_steps` micro-batches (and over the tasks in per-task mode); the optimizer steps once.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional

import torch
from torch import Tensor, nn

from mtl_bench.balancers import Balancer
from mtl_bench.config import TrainerConf
from mtl_bench.engine.data import StepSampler
from mtl_bench.engine.precision import Precision
from mtl_bench.tasks.base import TaskSet


class BackwardScale:
    """What the balancers scale their backward (and norm probes) with: the grad scaler's scale times `factor`.

    `factor` is 1/k under gradient accumulation, so the accumulated gradient is the mean over the k
    micro-batches, and NaN when a loss of the micro-batch is not finite, so that every gradient is too and
    the grad scaler skips the step on the device (no host sync to decide it).
    """

    def __init__(self, scaler: Optional[torch.amp.GradScaler]) -> None:
        self.scaler = scaler
        self.factor: Tensor | float = 1.0

    def scale(self, outputs: Tensor) -> Tensor:
        outputs = outputs * self.factor
        return self.scaler.scale(outputs) if self.scaler is not None else outputs


@dataclass
class StepOutput:
    losses: Tensor  # (T,) each task's loss, mean over the step's micro-batches, detached float32
    metrics: dict[str, Tensor]  # the balancer's measurements


def optimizer_steps_per_epoch(conf: TrainerConf, n_train: int, world_size: int = 1) -> int:
    """Optimizer steps per pass over the training split (per task stream in per-task mode): global batches
    of batch_size × world_size, grad_accumulation_steps of them per step."""
    return max(1, n_train // (conf.batch_size * world_size) // conf.grad_accumulation_steps)


class StepRunner:
    """Runs the forwards and backwards of optimizer step `step`; the caller zeroes grads and steps the optimizer.

    `model` may be DistributedDataParallel: every backward but the step's last runs under `no_sync`, so the
    gradients are all-reduced once. Each rank takes its slice of a global batch of batch_size × world_size,
    so N ranks with batch b see the same samples as one process with batch N·b.
    """

    def __init__(self, model: nn.Module, taskset: TaskSet, balancer: Balancer, precision: Precision,
                 scale: BackwardScale, conf: TrainerConf, seed: int, rank: int = 0, world_size: int = 1) -> None:
        self.model, self.taskset, self.balancer = model, taskset, balancer
        self.precision, self.scale, self.conf = precision, scale, conf
        self.rank, self.per_rank = rank, conf.batch_size
        self.k = conf.grad_accumulation_steps
        global_batch = conf.batch_size * world_size
        n = len(taskset.train)
        if conf.step_mode == "per_task":
            self.samplers = [StepSampler(n, global_batch, seed, stream=i + 1) for i in range(len(taskset.tasks))]
        else:
            self.samplers = [StepSampler(n, global_batch, seed)]
        self.steps_per_epoch = optimizer_steps_per_epoch(conf, n, world_size)
        balancer.accumulates = self.k > 1
        self.on_first_losses: Optional[Callable[[list[Tensor]], None]] = None  # detect_anomalous_params

    def _batch(self, sampler: StepSampler, loader_step: int) -> tuple[Tensor, dict[str, Tensor]]:
        train = self.taskset.train
        index = sampler.indices(loader_step)[self.rank * self.per_rank:(self.rank + 1) * self.per_rank]
        return train.batch(index.to(train.inputs.device, non_blocking=True))

    def _sync(self, last: bool) -> ContextManager[Any]:
        no_sync = getattr(self.model, "no_sync", None)  # DDP only
        return contextlib.nullcontext() if last or no_sync is None else no_sync()

    def _guard(self, losses: list[Tensor]) -> None:
        """Set this micro-batch's backward factor: 1/k, or NaN when a loss is not finite (see BackwardScale)."""
        finite = torch.isfinite(torch.stack(losses)).all()
        self.scale.factor = torch.where(finite, 1.0 / self.k, float("nan"))
        if self.on_first_losses is not None:
            self.on_first_losses(losses)
            self.on_first_losses = None

    def run(self, step: int) -> StepOutput:
        tasks = self.taskset.tasks
        totals: list[Tensor] = []
        metrics: dict[str, Tensor] = {}
        for j in range(self.k):
            loader_step = step * self.k + j
            if self.conf.step_mode == "joint":
                inputs, targets = self._batch(self.samplers[0], loader_step)
                with self._sync(last=j == self.k - 1):
                    with self.precision.autocast():
                        out = self.model(inputs)
                    # Losses in float32 whatever the autocast dtype; backward outside autocast.
                    losses = {t.name: t.loss(out.preds[t.name].float(), targets[t.name]) for t in tasks}
                    self._guard(list(losses.values()))
                    metrics = self.balancer.backward(losses, out.shared, self.scale)
                totals.append(torch.stack([losses[t.name].detach() for t in tasks]))
                continue
            per_task = []
            for i, task in enumerate(tasks):
                inputs, targets = self._batch(self.samplers[i], loader_step)
                with self._sync(last=j == self.k - 1 and i == len(tasks) - 1):
                    with self.precision.autocast():
                        out = self.model(inputs, tasks=[task.name])
                    loss = task.loss(out.preds[task.name].float(), targets[task.name])
                    self._guard([loss])
                    metrics |= self.balancer.backward_task(task.name, loss, out.shared, self.scale)
                per_task.append(loss.detach())
            totals.append(torch.stack(per_task))
        return StepOutput(torch.stack(totals).float().mean(0), metrics)
