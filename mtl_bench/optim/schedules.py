"""Learning-rate schedules stepped once per optimizer step, each after an optional linear warmup.

Chosen with `optim/schedule=<option>` (conf/optim/schedule/); the engine passes `optimizer` and, where the
signature asks for it, `total_steps`. icefall's Eden/Eden2 and mmcv's cyclic schedule live in eden.py and
cyclic.py.
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

import torch
from torch.optim.lr_scheduler import LRScheduler


class WarmupSchedule(LRScheduler):
    """lr = base lr × factor(step): step s < W gives (s + 1) / W (so the first step already moves and step
    W-1 reaches the full lr), then `decay(s - W)`. Without a decay this is a constant lr after warmup."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int = 0) -> None:
        """
        optimizer: the optimizer (given by the engine).
        warmup_steps: linear warmup from lr/warmup_steps to lr over this many steps (>= 0).
        """
        if not warmup_steps >= 0:
            raise ValueError(f"warmup_steps: must be >= 0, got {warmup_steps}")
        self.warmup_steps = int(warmup_steps)
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
        self, optimizer: torch.optim.Optimizer, step_size: int = 1000, gamma: float = 0.1, warmup_steps: int = 0
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        step_size: steps between decays (> 0).
        gamma: the factor of each decay (> 0).
        warmup_steps: linear warmup steps before the schedule (>= 0).
        """
        if not step_size > 0:
            raise ValueError(f"step_size: must be > 0, got {step_size}")
        if not gamma > 0:
            raise ValueError(f"gamma: must be > 0, got {gamma}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, warmup_steps)

    def decay(self, since: int) -> float:
        return self.gamma ** (since // self.step_size)


class MultiStep(WarmupSchedule):
    """After warmup, the lr is multiplied by `gamma` at each of `milestones` (steps counted after warmup)."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, milestones: Sequence[int], gamma: float = 0.1, warmup_steps: int = 0
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        milestones: increasing positive step counts, at least one, e.g. [1000, 2000].
        gamma: the factor at each milestone (> 0).
        warmup_steps: linear warmup steps before the schedule (>= 0).
        """
        milestones = [int(m) for m in milestones]
        if not milestones or milestones != sorted(milestones) or milestones[0] <= 0:
            raise ValueError(f"milestones: need increasing positive step counts, e.g. [1000,2000], got {milestones}")
        if not gamma > 0:
            raise ValueError(f"gamma: must be > 0, got {gamma}")
        self.milestones, self.gamma = milestones, float(gamma)
        super().__init__(optimizer, warmup_steps)

    def decay(self, since: int) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, since)


class Cosine(WarmupSchedule):
    """After warmup, the lr follows half a cosine from lr to `min_lr_ratio` × lr over the remaining steps."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, min_lr_ratio: float = 0.0, warmup_steps: int = 0
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        total_steps: the run's optimizer steps (given by the engine).
        min_lr_ratio: the final lr as a fraction of lr, 0..1.
        warmup_steps: linear warmup steps before the schedule (>= 0).
        """
        if not 0 <= min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio: must be in 0..1, got {min_lr_ratio}")
        self.min_lr_ratio = float(min_lr_ratio)
        self.decay_steps = max(1, int(total_steps) - int(warmup_steps))
        super().__init__(optimizer, warmup_steps)

    def decay(self, since: int) -> float:
        progress = min(1.0, since / self.decay_steps)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
