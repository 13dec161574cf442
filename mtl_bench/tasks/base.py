"""What a task set is: named tasks (loss + metrics) and their train/val/test data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor
from torch.utils.data import Dataset

LossFn = Callable[[Tensor, Tensor], Tensor]
MetricsFn = Callable[[Tensor, Tensor], "dict[str, Tensor]"]
SummarizeFn = Callable[["dict[str, Tensor]", int], "dict[str, Tensor]"]
Splits = Union[Dataset, Mapping[str, Dataset]]  # one dataset, or one per task (multi-input)


@dataclass(frozen=True)
class Task:
    """One task of a task set.

    `loss(pred, target)` returns a scalar tensor (mean over the batch).
    `metrics(pred, target)` returns per-batch *sums* (tensors of any shape: a count, a confusion matrix,
    a histogram), added up over an evaluation split on the device; `summarize(sums, n)` turns the totals
    into the metrics (0-d tensors; by default each sum divided by the sample count n, i.e. a per-sample
    mean). Metrics that are not per-sample means (mIoU over classes present, errors over valid pixels)
    give their own `summarize`.
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
    summarize: SummarizeFn | None = None


@dataclass
class Split(Dataset):
    """One split held in memory: inputs and one target tensor per task (same first dimension)."""

    inputs: Tensor
    targets: dict[str, Tensor]

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def batch(self, index: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        return self.inputs[index], {name: t[index] for name, t in self.targets.items()}

    def __getitem__(self, i: int) -> tuple[Tensor, dict[str, Tensor]]:
        return self.inputs[i], {name: t[i] for name, t in self.targets.items()}


class TaskSet:
    """Tasks plus their data: the base of every task set (`tasks=<option>` builds a subclass by `_target_`).

    `train`, `val`, `test`: a `Split` held in memory (the fast path: the loop indexes it on the device) or
    any map-style `torch.utils.data.Dataset` whose items are `(input, {task: target})`, served by a
    DataLoader (workers, pinned memory, per-rank slices under DDP). `input_shape` excludes the batch
    dimension. `reference`: single-task metrics {task: {metric: value}} for `mtl-bench report -b reference`.
    A dataset served by the DataLoader is indexed with ints that carry `.key`, a number that depends on the
    draw alone (seed, step, position): random augmentation seeded from it is the same with any number of loader
    workers and across a resume (tasks/dense/tree.py does so). A dataset with a `collate(items)` method batches its own
    items (tasks/qm9.py: graphs into a PyG `Batch`); a batch's input may be any object with `.to(device)`.
    A task set whose Pareto front is known gives a `true_front(n)` method: n points of it (each a loss per task, in
    task order); every run records them in metrics.json and the report measures fronts against them
    (tasks/pareto_toy.py).

    Multi-input task sets (each task its own images: Office-31's domains) give every split as a dict
    {task: dataset} whose items are `(input, {task: target})` for that task alone; they train with
    `trainer.step_mode=per_task` (one batch per task per step) and each task is evaluated on its own data.
    """

    def __init__(
        self,
        tasks: list[Task],
        input_shape: Sequence[int],
        train: Splits,
        val: Splits,
        test: Splits,
        reference: Optional[Mapping[str, Mapping[str, float]]] = None,
    ) -> None:
        self.tasks, self.input_shape = list(tasks), tuple(int(n) for n in input_shape)
        self.train, self.val, self.test = train, val, test
        for split in (train, val, test):
            if isinstance(split, Mapping) and set(split) != set(self.task_names):
                raise ValueError(
                    f"a multi-input split must have one dataset per task ({', '.join(self.task_names)}); "
                    f"got {', '.join(split)}"
                )
        self.reference = check_reference(reference, self.tasks)

    @property
    def multi_input(self) -> bool:
        return isinstance(self.train, Mapping)

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def keep_only(self, names: Sequence[str]) -> "TaskSet":
        """Drop every task not in `names` (a single-task baseline trains one): its head, targets and reference."""
        self.tasks = [t for t in self.tasks if t.name in names]
        for attr in ("train", "val", "test"):
            splits = getattr(self, attr)
            if isinstance(splits, Mapping):
                setattr(self, attr, {name: data for name, data in splits.items() if name in names})
            elif isinstance(splits, Split):
                splits.targets = {name: t for name, t in splits.targets.items() if name in names}
        if self.reference is not None:
            self.reference = {task: values for task, values in self.reference.items() if task in names}
        return self

    def to(self, device: torch.device) -> "TaskSet":
        """Move the in-memory splits to `device` (datasets stay where their loader reads them)."""
        for splits in (self.train, self.val, self.test):
            for split in splits.values() if isinstance(splits, Mapping) else [splits]:
                if not isinstance(split, Split):
                    continue
                split.inputs = split.inputs.to(device)
                split.targets = {k: v.to(device) for k, v in split.targets.items()}
        return self


def check_reference(
    reference: Optional[Mapping[str, Mapping[str, float]]], tasks: list[Task]
) -> Optional[dict[str, dict[str, float]]]:
    """`reference` may name only these tasks and their metrics (or "loss"), with numbers."""
    if reference is None:
        return None
    metrics = {task.name: ["loss", *task.higher_is_better] for task in tasks}
    if not isinstance(reference, Mapping):
        raise ValueError(f"reference: must be null or {{task: {{metric: number}}}}, got {reference!r}")
    for task, values in reference.items():
        if task not in metrics:
            raise ValueError(f"reference.{task}: no such task; tasks: {', '.join(metrics)}")
        if not isinstance(values, Mapping):
            raise ValueError(f"reference.{task}: must be {{metric: number}}, got {values!r}")
        for name, value in values.items():
            if name not in metrics[task]:
                raise ValueError(f"reference.{task}.{name}: no such metric; metrics: {', '.join(metrics[task])}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"reference.{task}.{name}: must be a number, got {value!r}")
    return {task: {name: float(v) for name, v in values.items()} for task, values in reference.items()}


def root_folder(root: Optional[str], holds: str, option: str, expected: str) -> Path:
    """`tasks.root` as an existing folder, else ValueError("root: <what is wrong>; <expected>"): `holds` says what
    the folder holds (for the error when it is not set), `option` the task set's option (for its example)."""

    def fail(message: str) -> ValueError:
        return ValueError(f"root: {message}; {expected}")

    if root is None or str(root).strip() == "":
        raise fail(f"not set: give the folder that holds {holds}, e.g. tasks.root=/data/{option}")
    path = Path(root).expanduser()
    if not path.exists():
        raise fail(f"{path} does not exist")
    if not path.is_dir():
        raise fail(f"{path} is not a directory")
    return path
