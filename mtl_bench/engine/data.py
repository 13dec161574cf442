"""Batches from an in-memory split, in an order that is a pure function of (seed, step).

Because the order depends on nothing but the step, a resumed run sees exactly the batches the
uninterrupted run would have seen, with no sampler state to checkpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtl_bench.errors import ConfigError


class StepSampler:
    """Epoch e is a permutation of range(n) drawn from seed and e; the last incomplete batch is dropped.

    `stream` > 0 draws an independent order from the same seed (per-task mode: one stream per task).
    """

    def __init__(self, n: int, batch_size: int, seed: int, stream: int = 0) -> None:
        if batch_size > n:
            raise ConfigError(f"trainer.batch_size={batch_size} is larger than the training split ({n} samples)")
        self.n, self.batch_size, self.seed, self.stream = n, batch_size, seed, stream
        self.steps_per_epoch = n // batch_size
        self._epoch = -1
        self._perm = torch.empty(0, dtype=torch.long)

    def indices(self, step: int) -> Tensor:
        epoch, position = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            # The CPU generator keeps 32 bits of its seed: streams are spread over them (golden-ratio step).
            offset = (self.stream * 0x9E3779B1) % 2**32
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + offset)
            self._perm = torch.randperm(self.n, generator=generator)
            self._epoch = epoch
        start = position * self.batch_size
        return self._perm[start : start + self.batch_size]
