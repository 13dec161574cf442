"""Optimizers, parameter groups and schedules."""

from mtl_bench.optim.cyclic import CyclicSchedule
from mtl_bench.optim.eden import Eden, Eden2
from mtl_bench.optim.paramwise import build_param_groups
from mtl_bench.optim.plateau import Plateau
from mtl_bench.optim.scaled_adam import ScaledAdam
from mtl_bench.optim.schedules import Constant, Cosine, MultiStep, StepDecay, WarmupSchedule

__all__ = [
    "Constant",
    "Cosine",
    "CyclicSchedule",
    "Eden",
    "Eden2",
    "MultiStep",
    "Plateau",
    "ScaledAdam",
    "StepDecay",
    "WarmupSchedule",
    "build_param_groups",
]
