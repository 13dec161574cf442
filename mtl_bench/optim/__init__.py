"""Optimizers and schedules."""

from mtl_bench.optim.factory import build_optimizer, build_scheduler, lr_multiplier

__all__ = ["build_optimizer", "build_scheduler", "lr_multiplier"]
from mtl_bench.optim.eden import Eden, Eden2  # noqa: E402
from mtl_bench.optim.scaled_adam import ScaledAdam  # noqa: E402

__all__ += ["Eden", "Eden2", "ScaledAdam"]
