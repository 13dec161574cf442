"""Optimizers and schedules."""

from mtl_bench.optim.eden import Eden, Eden2
from mtl_bench.optim.factory import build_optimizer, build_scheduler, lr_multiplier
from mtl_bench.optim.scaled_adam import ScaledAdam

__all__ = ["Eden", "Eden2", "ScaledAdam", "build_optimizer", "build_scheduler", "lr_multiplier"]
