# Source: Eden/Eden2 of k2-fsa/icefall egs/librispeech/ASR/zipformer/optim.py (Daniel Povey, Apache-2.0); own code.
"""Eden and Eden2 learning-rate schedules for any torch optimizer.

The learning rate depends on the batch count and (Eden) the epoch count, each stepped on its own:
`step_batch()` after every optimizer step, `step_epoch()` at the end of every epoch (or `step_epoch(e)` at
the start of epoch e). Without epochs, use Eden2 or count "epochs" in some unit of data. Unlike icefall,
the lr is already set at construction (batch 0, epoch 0), so the first step runs with the warmup lr.
"""

from __future__ import annotations

from typing import Any

from torch.optim import Optimizer


class _BatchEpochSchedule:
    """Sets each group's lr to `initial_lr * factor(batch, epoch)`; the subclass gives the factor."""

    def __init__(self, optimizer: Optimizer, warmup_batches: float, warmup_start: float) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        if not 0.0 <= warmup_start <= 1.0:
            raise ValueError(f"warmup_start: must be in [0, 1], got {warmup_start}")
        self.optimizer = optimizer
        self.warmup_batches = warmup_batches
        self.warmup_start = warmup_start
        # Like torch's schedulers: a resumed optimizer keeps its original lr under "initial_lr".
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.batch = 0
        self.epoch = 0
        self._set_lrs()

    def factor(self) -> float:
        raise NotImplementedError

    def warmup(self) -> float:
        """Linear from `warmup_start` at batch 0 to 1 at `warmup_batches`, then 1."""
        if self.batch >= self.warmup_batches:
            return 1.0
        return self.warmup_start + (1.0 - self.warmup_start) * self.batch / self.warmup_batches

    def get_lr(self) -> list[float]:
        f = self.factor() * self.warmup()
        return [base * f for base in self.base_lrs]

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def step_batch(self, batch: int | None = None) -> None:
        """Count one batch, or set the batch count (summed over epochs) to `batch`."""
        self.batch = self.batch + 1 if batch is None else batch
        self._set_lrs()

    def step_epoch(self, epoch: int | None = None) -> None:
        """Count one finished epoch, or set the epoch count to `epoch` at the start of that epoch."""
        self.epoch = self.epoch + 1 if epoch is None else epoch
        self._set_lrs()

    step = step_batch  # so a loop that calls scheduler.step() after optimizer.step() works unchanged

    def state_dict(self) -> dict[str, Any]:
        return {"base_lrs": list(self.base_lrs), "batch": self.batch, "epoch": self.epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.base_lrs = list(state_dict["base_lrs"])
        self.batch = state_dict["batch"]
        self.epoch = state_dict["epoch"]
        self._set_lrs()

    def _set_lrs(self) -> None:
        lrs = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self._last_lr = lrs


class Eden(_BatchEpochSchedule):
    """lr = initial_lr * ((b^2 + B^2)/B^2)^-0.25 * ((e^2 + E^2)/E^2)^-0.25 * warmup(b), with b batches and e
    epochs done, B = `lr_batches` (icefall suggests 5000), E = `lr_epochs` (about 6 for a 20-40 epoch run)."""

    def __init__(
        self,
        optimizer: Optimizer,
        lr_batches: float = 7500.0,
        lr_epochs: float = 3.5,
        warmup_batches: float = 500.0,
        warmup_start: float = 0.5,
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        lr_batches: B, the batch count where the decay sets in (> 0; icefall zipformer: 7500).
        lr_epochs: E, the same in epochs (> 0; zipformer: 3.5).
        warmup_batches: linear warmup from warmup_start × lr over this many batches.
        warmup_start: the warmup's first lr as a fraction of lr, 0..1.
        """
        for name, value in (("lr_batches", lr_batches), ("lr_epochs", lr_epochs)):
            if not value > 0:
                raise ValueError(f"{name}: must be > 0, got {value}")
        self.lr_batches = lr_batches
        self.lr_epochs = lr_epochs
        super().__init__(optimizer, warmup_batches, warmup_start)

    def factor(self) -> float:
        b = ((self.batch**2 + self.lr_batches**2) / self.lr_batches**2) ** -0.25
        e = ((self.epoch**2 + self.lr_epochs**2) / self.lr_epochs**2) ** -0.25
        return b * e


class Eden2(_BatchEpochSchedule):
    """lr = initial_lr * ((b^2 + B^2)/B^2)^-0.5 * warmup(b): Eden without epochs, decaying like 1/b late."""

    def __init__(
        self, optimizer: Optimizer, lr_batches: float = 7500.0, warmup_batches: float = 500.0, warmup_start: float = 0.5
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        lr_batches: B, the batch count where the decay sets in (> 0).
        warmup_batches: linear warmup from warmup_start × lr over this many batches.
        warmup_start: the warmup's first lr as a fraction of lr, 0..1.
        """
        if not lr_batches > 0:
            raise ValueError(f"lr_batches: must be > 0, got {lr_batches}")
        self.lr_batches = lr_batches
        super().__init__(optimizer, warmup_batches, warmup_start)

    def factor(self) -> float:
        return ((self.batch**2 + self.lr_batches**2) / self.lr_batches**2) ** -0.5
