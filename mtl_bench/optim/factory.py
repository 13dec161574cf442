"""Optimizers and learning-rate schedules built from the `optim` config group."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR


def build_optimizer(conf: Any, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """`conf` is an SGDConf or AdamConf (mtl_bench.config)."""
    params = [p for p in params if p.requires_grad]
    if conf.name == "sgd":
        return torch.optim.SGD(params, lr=conf.lr, momentum=conf.momentum, nesterov=conf.nesterov,
                               weight_decay=conf.weight_decay)
    if conf.name == "adam":
        # AdamW decouples the decay from the gradient (Loshchilov & Hutter 2019); Adam adds L2 to it.
        cls = torch.optim.AdamW if conf.decoupled_weight_decay else torch.optim.Adam
        # fused: one pass over all tensors per step (CPU and CUDA) instead of one kernel per elementwise op.
        fused = all(p.device.type in ("cpu", "cuda") for p in params)
        return cls(params, lr=conf.lr, betas=tuple(conf.betas), eps=conf.eps, weight_decay=conf.weight_decay,
                   fused=fused)
    raise ValueError(f"unknown optimizer {conf.name!r}")


def lr_multiplier(schedule: Any, total_steps: int) -> Callable[[int], float]:
    """The factor applied to the base lr after `step` optimizer steps (what LambdaLR expects).

    Linear warmup: step s < W gives (s + 1) / W, so the first step already moves and step W-1 reaches
    the full lr. After warmup, `step` decays by `gamma` every `step_size` steps and `cosine` goes from 1
    to `min_lr_ratio` over the remaining steps.
    """
    warmup = schedule.warmup_steps
    decay_steps = max(1, total_steps - warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        since = step - warmup
        if schedule.name == "step":
            return schedule.gamma ** (since // schedule.step_size)
        if schedule.name == "cosine":
            progress = min(1.0, since / decay_steps)
            return schedule.min_lr_ratio + (1 - schedule.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return factor


def build_scheduler(schedule: Any, optimizer: torch.optim.Optimizer, total_steps: int) -> LambdaLR:
    """A LambdaLR stepped once per optimizer step; its state_dict keeps the step count for resume."""
    return LambdaLR(optimizer, lr_multiplier(schedule, total_steps))
