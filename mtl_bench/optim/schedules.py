"""Learning-rate schedules stepped once per optimizer step, each after an optional linear warmup.

Chosen with `optim/schedule=<option>` (conf/optim/schedule/); the engine passes `optimizer` and, where the
signature asks for them, `total_steps` and `steps_per_epoch`. Every length (step_size, milestones, warmup_steps)
is an optimizer-step count, or a string in epochs ("100 epochs") or in a fraction of the run ("50%"), converted
here, so a preset's schedule stays right when the batch size or the run's length changes. icefall's Eden/Eden2,
mmcv's cyclic schedule and the validation-stepped Plateau live in eden.py, cyclic.py and plateau.py.
"""

from __future__ import annotations

import bisect
import math
from typing import Optional, Sequence

import torch
from torch.optim.lr_scheduler import LRScheduler

from mtl_bench.settings import Length, to_steps


class WarmupSchedule(LRScheduler):
    """lr = base lr × factor(step): step s < W gives (s + 1) / W (so the first step already moves and step
    W-1 reaches the full lr), then `decay(s - W)`. Without a decay this is a constant lr after warmup."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_steps: Length = 0,
        steps_per_epoch: int = 1,
        total_steps: Optional[int] = None,
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        warmup_steps: linear warmup from lr/warmup_steps to lr over this many steps (>= 0; or epochs, or %).
        steps_per_epoch: the run's optimizer steps per epoch (given by the engine), to read lengths in epochs.
        total_steps: the run's optimizer steps (given by the engine), to read lengths in %.
        """
        warmup = to_steps("warmup_steps", warmup_steps, steps_per_epoch, total_steps)
        if not warmup >= 0:
            raise ValueError(f"warmup_steps: must be >= 0, got {warmup_steps}")
        self.warmup_steps = warmup
        super().__init__(optimizer)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        return self.decay(step - self.warmup_steps)

    def decay(self, since: int) -> float:
        return 1.0

    def get_lr(self) -> list[float]:  # type: ignore[override]
        factor = self.factor(self.last_epoch)
        return [float(base) * factor for base in self.base_lrs]


class Constant(WarmupSchedule):
    """The base lr throughout (after the warmup, if any)."""


class StepDecay(WarmupSchedule):
    """After warmup, the lr is multiplied by `gamma` every `step_size` steps."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        step_size: Length = 1000,
        gamma: float = 0.1,
        warmup_steps: Length = 0,
        steps_per_epoch: int = 1,
        total_steps: Optional[int] = None,
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        step_size: steps between decays (> 0; or "<n> epochs", or "<p>%" of the run).
        gamma: the factor of each decay (> 0).
        warmup_steps: linear warmup steps before the schedule (>= 0).
        steps_per_epoch: the run's optimizer steps per epoch (given by the engine).
        total_steps: the run's optimizer steps (given by the engine).
        """
        size = to_steps("step_size", step_size, steps_per_epoch, total_steps)
        if not size > 0:
            raise ValueError(f"step_size: must be > 0, got {step_size}")
        if not gamma > 0:
            raise ValueError(f"gamma: must be > 0, got {gamma}")
        self.step_size, self.gamma = size, float(gamma)
        super().__init__(optimizer, warmup_steps, steps_per_epoch, total_steps)

    def decay(self, since: int) -> float:
        return self.gamma ** (since // self.step_size)


class MultiStep(WarmupSchedule):
    """After warmup, the lr is multiplied by `gamma` at each of `milestones` (steps counted after warmup)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        milestones: Sequence[Length],
        gamma: float = 0.1,
        warmup_steps: Length = 0,
        steps_per_epoch: int = 1,
        total_steps: Optional[int] = None,
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        milestones: increasing positive step counts, at least one, e.g. [1000, 2000] (or epochs, or %).
        gamma: the factor at each milestone (> 0).
        warmup_steps: linear warmup steps before the schedule (>= 0).
        steps_per_epoch: the run's optimizer steps per epoch (given by the engine).
        total_steps: the run's optimizer steps (given by the engine).
        """
        steps = [to_steps("milestones", m, steps_per_epoch, total_steps) for m in milestones]
        if not steps or steps != sorted(steps) or steps[0] <= 0:
            raise ValueError(f"milestones: need increasing positive step counts, e.g. [1000,2000], got {milestones}")
        if not gamma > 0:
            raise ValueError(f"gamma: must be > 0, got {gamma}")
        self.milestones, self.gamma = steps, float(gamma)
        super().__init__(optimizer, warmup_steps, steps_per_epoch, total_steps)

    def decay(self, since: int) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, since)


class Cosine(WarmupSchedule):
    """After warmup, the lr follows half a cosine from lr to `min_lr_ratio` × lr over the remaining steps."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        min_lr_ratio: float = 0.0,
        warmup_steps: Length = 0,
        steps_per_epoch: int = 1,
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        total_steps: the run's optimizer steps (given by the engine).
        min_lr_ratio: the final lr as a fraction of lr, 0..1.
        warmup_steps: linear warmup steps before the schedule (>= 0; or epochs, or %).
        steps_per_epoch: the run's optimizer steps per epoch (given by the engine).
        """
        if not 0 <= min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio: must be in 0..1, got {min_lr_ratio}")
        self.min_lr_ratio = float(min_lr_ratio)
        warmup = to_steps("warmup_steps", warmup_steps, steps_per_epoch, total_steps)
        self.decay_steps = max(1, int(total_steps) - warmup)
        super().__init__(optimizer, warmup, steps_per_epoch, total_steps)

    def decay(self, since: int) -> float:
        progress = min(1.0, since / self.decay_steps)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
