"""Batches of a split, in an order that is a pure function of (seed, step).

Because the order depends on nothing but the step, a resumed run sees exactly the batches the
uninterrupted run would have seen, with no sampler state to checkpoint.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from mtl_bench.errors import ConfigError
from mtl_bench.tasks.base import Split, Splits


class StepSampler:
    """Epoch e is a permutation of range(n) drawn from seed and e; the last incomplete batch is dropped.

    `stream` > 0 draws an independent order from the same seed (per-task mode: one stream per task).
    """

    def __init__(self, n: int, batch_size: int, seed: int, stream: int = 0) -> None:
        if batch_size > n:
            raise ConfigError(f"trainer.batch_size={batch_size} is larger than the training split ({n} samples)")
        self.n, self.batch_size, self.seed, self.stream = n, batch_size, seed, stream
        self.steps_per_epoch = n // batch_size
        self.pin = False  # set by a BatchSource on CUDA: the indices' copy to the device then never waits
        self._epoch = -1
        self._perm = torch.empty(0, dtype=torch.long)

    def indices(self, step: int) -> Tensor:
        epoch, position = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            # The CPU generator keeps 32 bits of its seed: streams are spread over them (golden-ratio step).
            offset = (self.stream * 0x9E3779B1) % 2**32
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + offset)
            self._perm = torch.randperm(self.n, generator=generator)
            if self.pin:  # once an epoch; a step's indices are a view of it, so pinned too
                self._perm = self._perm.pin_memory()
            self._epoch = epoch
        start = position * self.batch_size
        return self._perm[start : start + self.batch_size]


def task_split(split: Splits, task: str) -> Dataset:
    """The data `task` trains or is evaluated on: its own dataset in a multi-input split, else the split."""
    return split[task] if isinstance(split, Mapping) else split


class SampleIndex(int):
    """A sample's index in its split, carrying `key`: a number that is a pure function of the draw (the run's
    seed, the sample stream, the loader step and the position in the global batch). A dataset with random
    augmentation seeds it from `key` (tasks/dense/tree.py), so that a draw is augmented alike whatever the number of
    loader workers and whether the run was resumed."""

    key: int

    def __new__(cls, index: int, key: int) -> "SampleIndex":
        self = super().__new__(cls, index)
        self.key = key
        return self

    def __reduce__(self) -> tuple[type, tuple[int, int]]:  # to DataLoader workers and back
        return SampleIndex, (int(self), self.key)


def draw_key(seed: int, stream: int, step: int, position: int) -> int:
    """Mixes the four into 63 bits (splitmix64-style odd multipliers): distinct draws get unrelated keys."""
    mixed = (
        seed * 0x9E3779B97F4A7C15
        + stream * 0xBF58476D1CE4E5B9
        + step * 0x94D049BB133111EB
        + position * 0xD6E8FEB86659FD93
    )
    return mixed % 2**63


class BatchSource:
    """This rank's batches of one sample stream: step → the sampler's global batch → this rank's slice.

    A `Split` (tensor-resident) is indexed directly on the device. Any other dataset is served by a
    DataLoader (workers, pinned memory on CUDA) over a batch sampler that replays the same indices from the
    requested step on, so a resumed run reads exactly the batches the uninterrupted one would have. On CUDA every
    host-to-device copy of the step (the indices, a loaded batch) is from pinned memory and non-blocking, so the
    loop never waits for the device there (tests/engine/test_data.py).
    """

    def __init__(
        self, split: Dataset, sampler: StepSampler, rank: int, per_rank: int, device: torch.device, num_workers: int = 0
    ) -> None:
        self.split, self.sampler, self.device, self.num_workers = split, sampler, device, num_workers
        self.rows = slice(rank * per_rank, (rank + 1) * per_rank)
        if device.type == "cuda":
            sampler.pin = True
        self._batches: Iterator[Any] | None = None
        self._next_step = -1

    def indices(self, loader_step: int) -> Tensor:
        return self.sampler.indices(loader_step)[self.rows]

    def keyed_indices(self, loader_step: int) -> list[SampleIndex]:
        """This rank's indices of the step, each with the key of its draw."""
        s, first = self.sampler, self.rows.start
        return [
            SampleIndex(i, draw_key(s.seed, s.stream, loader_step, first + j))
            for j, i in enumerate(self.indices(loader_step).tolist())
        ]

    def batch(self, loader_step: int) -> tuple[Any, dict[str, Tensor]]:
        if isinstance(self.split, Split):
            return self.split.batch(self.indices(loader_step).to(self.split.inputs.device, non_blocking=True))
        if self._batches is None or loader_step != self._next_step:
            self._batches = iter(
                DataLoader(
                    self.split,
                    batch_sampler=_Replay(self, loader_step),
                    num_workers=self.num_workers,
                    pin_memory=self.device.type == "cuda",
                    collate_fn=getattr(self.split, "collate", None),
                )
            )
        self._next_step = loader_step + 1
        inputs, targets = next(self._batches)
        return to_device(inputs, targets, self.device)

    def close(self) -> None:
        """Shut the loader's workers down now rather than at interpreter exit: each finishes at most the batch
        it is loading and drops the ones queued for it (prefetch). A later `batch()` starts a new loader."""
        batches, self._batches, self._next_step = self._batches, None, -1
        # The multi-process iterator's own shutdown, which its __del__ would run at some later point.
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


class _Replay:
    """An endless batch sampler: the source's index lists from step `start` on."""

    def __init__(self, source: BatchSource, start: int) -> None:
        self.source, self.start = source, start

    def __iter__(self) -> Iterator[list[SampleIndex]]:
        step = self.start
        while True:
            yield self.source.keyed_indices(step)
            step += 1


class Subset(Dataset):
    """Some rows of a dataset read from disk, keeping what BatchSource relies on: the key each drawn index
    carries (SampleIndex) and the dataset's own `collate`."""

    def __init__(self, dataset: Dataset, rows: Tensor) -> None:
        self.dataset, self.rows = dataset, rows.tolist()
        self.collate = getattr(dataset, "collate", None)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Any:
        row = self.rows[i]
        return self.dataset[SampleIndex(row, i.key) if isinstance(i, SampleIndex) else row]


def subset(split: Dataset, rows: Tensor) -> Dataset:
    """`rows` of `split`: a tensor-resident Split stays one (indexed on its device), anything else is a Subset."""
    if isinstance(split, Split):
        index = rows.to(split.inputs.device)
        return Split(split.inputs[index], {name: t[index] for name, t in split.targets.items()})
    return Subset(split, rows)


HOLDOUT_STREAM = -1  # the validation batches' order, apart from the training streams (0, and 1..T per task)


def hold_out(split: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """(the rows left to train on, the held-out rows): round(fraction × n) rows drawn by `seed`, in index order."""
    n = len(split)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(seed * 1_000_003 + 0x5F3759DF)  # apart from every sampler's seeds
    order = torch.randperm(n, generator=generator)
    held = round(fraction * n)
    return subset(split, order[held:].sort().values), subset(split, order[:held].sort().values)


def to_device(inputs: Any, targets: dict[str, Tensor], device: torch.device) -> tuple[Any, dict[str, Tensor]]:
    """Inputs are a tensor, a dict of tensors or any object with `.to(device)` (a PyG `Batch` of graphs)."""
    if isinstance(inputs, Mapping):
        inputs = {name: x.to(device, non_blocking=True) for name, x in inputs.items()}
    else:
        inputs = inputs.to(device, non_blocking=True)
    return inputs, {name: t.to(device, non_blocking=True) for name, t in targets.items()}


def eval_batches(
    split: Dataset, batch_size: int, device: torch.device, num_workers: int = 0
) -> Iterator[tuple[Any, dict[str, Tensor]]]:
    """A split in order, in batches of `batch_size`: indexed on the device for a Split, else a DataLoader."""
    if isinstance(split, Split):
        n = len(split)
        for start in range(0, n, batch_size):
            yield split.batch(torch.arange(start, min(start + batch_size, n), device=split.inputs.device))
        return
    for inputs, targets in DataLoader(
        split,
        batch_size=batch_size,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        collate_fn=getattr(split, "collate", None),  # a task set's own batching (graphs into a PyG Batch)
    ):
        yield to_device(inputs, targets, device)
