"""Optimizers and learning-rate schedules built from the `optim` config group."""

from __future__ import annotations

import bisect
import math
from typing import Any, Callable, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

from mtl_bench.errors import ConfigError
from mtl_bench.optim.cyclic import CyclicSchedule
from mtl_bench.optim.eden import Eden, Eden2
from mtl_bench.optim.registry import resolve_optimizer_class
from mtl_bench.optim.scaled_adam import ScaledAdam


ParamsOrGroups = Iterable[Any]  # parameters, or param-group dicts as `build_param_groups` makes them


def _params_of(params: list[Any]) -> list[torch.Tensor]:
    return [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]


def build_optimizer(conf: Any, params: ParamsOrGroups) -> torch.optim.Optimizer:
    """`conf` is one of the optim schemas of mtl_bench.config; `params` parameters or param groups."""
    params = [p for p in params if isinstance(p, dict) or p.requires_grad]
    # fused: one pass over all tensors per step (CPU and CUDA) instead of one kernel per elementwise op,
    # and it can skip a non-finite step on the device (see engine/skip_step.py)
    fused = all(p.device.type in ("cpu", "cuda") for p in _params_of(params))
    if conf.name == "sgd":
        return torch.optim.SGD(params, lr=conf.lr, momentum=conf.momentum, nesterov=conf.nesterov,
                               weight_decay=conf.weight_decay, fused=fused)
    if conf.name == "adam":
        # AdamW decouples the decay from the gradient (Loshchilov & Hutter 2019); Adam adds L2 to it.
        cls = torch.optim.AdamW if conf.decoupled_weight_decay else torch.optim.Adam
        return cls(params, lr=conf.lr, betas=tuple(conf.betas), eps=conf.eps, weight_decay=conf.weight_decay,
                   fused=fused)
    if conf.name == "scaled_adam":
        compile_mode = {"auto": "auto", "true": True, "false": False}[str(conf.compile).lower()]
        return ScaledAdam(params, lr=conf.lr, clipping_scale=conf.clipping_scale, betas=tuple(conf.betas),
                          scalar_lr_scale=conf.scalar_lr_scale, eps=conf.eps, param_min_rms=conf.param_min_rms,
                          param_max_rms=conf.param_max_rms, scalar_max=conf.scalar_max,
                          size_update_period=conf.size_update_period,
                          clipping_update_period=conf.clipping_update_period, compile=compile_mode)
    if conf.name == "custom":
        try:
            cls = resolve_optimizer_class(conf.class_path)
        except ValueError as err:
            raise ConfigError(f"optim.class_path={conf.class_path!r}: {err}") from None
        try:
            return cls(params, lr=conf.lr, weight_decay=conf.weight_decay, **dict(conf.kwargs or {}))
        except TypeError as err:  # an argument the class does not take
            raise ConfigError(f"optim.kwargs: {cls.__name__} rejects the arguments ({err})") from None
    raise ValueError(f"unknown optimizer {conf.name!r}")


def lr_multiplier(schedule: Any, total_steps: int) -> Callable[[int], float]:
    """The factor applied to the base lr after `step` optimizer steps (what LambdaLR expects).

    Linear warmup: step s < W gives (s + 1) / W, so the first step already moves and step W-1 reaches
    the full lr. After warmup, `step` decays by `gamma` every `step_size` steps, `multistep` at each of
    `milestones` (counted after warmup), and `cosine` goes from 1 to `min_lr_ratio` over the remaining steps.
    """
    warmup = schedule.warmup_steps
    decay_steps = max(1, total_steps - warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        since = step - warmup
        if schedule.name == "step":
            return schedule.gamma ** (since // schedule.step_size)
        if schedule.name == "multistep":
            return schedule.gamma ** bisect.bisect_right(schedule.milestones, since)
        if schedule.name == "cosine":
            progress = min(1.0, since / decay_steps)
            return schedule.min_lr_ratio + (1 - schedule.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return factor


def build_scheduler(schedule: Any, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    """A schedule stepped once per optimizer step (`.step()`); its state_dict holds its position for resume.

    none/step/multistep/cosine: a LambdaLR over `lr_multiplier`; eden/eden2: icefall's schedules (the trainer
    also calls `step_epoch()` after each epoch); cyclic: mmcv's cyclic lr and momentum.
    """
    if schedule.name == "eden":
        return Eden(optimizer, schedule.lr_batches, schedule.lr_epochs, warmup_batches=schedule.warmup_steps,
                    warmup_start=schedule.warmup_start)
    if schedule.name == "eden2":
        return Eden2(optimizer, schedule.lr_batches, warmup_batches=schedule.warmup_steps,
                     warmup_start=schedule.warmup_start)
    if schedule.name == "cyclic":
        momentum = schedule.momentum_target_ratio
        return CyclicSchedule(optimizer, total_steps, target_ratio=tuple(schedule.target_ratio),
                              cyclic_times=schedule.cyclic_times, step_ratio_up=schedule.step_ratio_up,
                              anneal_strategy=schedule.anneal_strategy,
                              momentum_target_ratio=tuple(momentum) if momentum is not None else None)
    return LambdaLR(optimizer, lr_multiplier(schedule, total_steps))
