"""engine/data.py: a batch source's loader workers stop when it is closed (a stopped run waits for no prefetch)."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset

from mtl_bench.engine.data import BatchSource, StepSampler


class SlowSamples(Dataset):
    """Each sample takes 0.2 s to load."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        time.sleep(0.2)
        return torch.full((2,), float(index)), {"a": torch.tensor(float(index))}


def test_close_stops_the_workers_and_a_later_batch_starts_a_new_loader():
    source = BatchSource(SlowSamples(), StepSampler(64, 4, seed=0), 0, 4, torch.device("cpu"), num_workers=2)
    first, _ = source.batch(0)
    loader = source._batches  # held elsewhere too, as a traceback's frame holds it after a signal in next()
    workers = list(loader._workers)  # type: ignore[union-attr]  # the multi-process iterator's
    assert len(workers) == 2 and all(w.is_alive() for w in workers)  # loading the prefetched batches
    source.close()
    assert not any(w.is_alive() for w in workers)
    again, _ = source.batch(0)  # the same batch from a new loader
    assert torch.equal(again, first)
    source.close()
