"""Optimizers, parameter groups and schedules."""

from mtl_bench.optim.cyclic import CyclicSchedule
from mtl_bench.optim.eden import Eden, Eden2
from mtl_bench.optim.factory import build_optimizer, build_scheduler, lr_multiplier
from mtl_bench.optim.paramwise import build_param_groups
from mtl_bench.optim.registry import resolve_optimizer_class
from mtl_bench.optim.scaled_adam import ScaledAdam

__all__ = ["CyclicSchedule", "Eden", "Eden2", "ScaledAdam", "build_optimizer", "build_param_groups",
           "build_scheduler", "lr_multiplier", "resolve_optimizer_class"]
