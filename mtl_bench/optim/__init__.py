"""Optimizers and schedules."""

from mtl_bench.optim.factory import build_optimizer, build_scheduler, lr_multiplier

__all__ = ["build_optimizer", "build_scheduler", "lr_multiplier"]
