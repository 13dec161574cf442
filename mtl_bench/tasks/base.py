"""What a task set is: named tasks (loss + metrics) and in-memory train/val/test tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

LossFn = Callable[[Tensor, Tensor], Tensor]
MetricsFn = Callable[[Tensor, Tensor], "dict[str, Tensor]"]


@dataclass(frozen=True)
class Task:
    """One task of a task set.

    `loss(pred, target)` returns a scalar tensor (mean over the batch).
    `metrics(pred, target)` returns per-batch *sums* of each metric as 0-d tensors, so that
    evaluation can add them over batches and divide by the sample count once (no host sync per batch).
    `higher_is_better[name]` says which way each metric improves (Δm needs it).
    `out_dim` is the width of the task's head; `initial_loss` is the theoretical loss of an
    uninformed predictor when one is known (e.g. log C for C-class cross-entropy), else None.
    """

    name: str
    out_dim: int
    loss: LossFn
    metrics: MetricsFn
    higher_is_better: dict[str, bool]
    initial_loss: float | None = None


@dataclass
class Split:
    """One split held in memory: inputs and one target tensor per task (same first dimension)."""

    inputs: Tensor
    targets: dict[str, Tensor]

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def batch(self, index: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        return self.inputs[index], {name: t[index] for name, t in self.targets.items()}


@dataclass
class TaskSet:
    """Tasks plus their data. `input_shape` excludes the batch dimension."""

    name: str
    tasks: list[Task]
    input_shape: tuple[int, ...]
    train: Split
    val: Split
    test: Split

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def to(self, device: torch.device) -> "TaskSet":
        for split in (self.train, self.val, self.test):
            split.inputs = split.inputs.to(device)
            split.targets = {k: v.to(device) for k, v in split.targets.items()}
        return self
