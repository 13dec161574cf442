"""SGD/Adam construction and the LR schedules, checked against their formulas."""

from __future__ import annotations

import math

import pytest
import torch

from mtl_bench.config import AdamConf, ScheduleConf, SGDConf
from mtl_bench.optim import build_optimizer, build_scheduler, lr_multiplier


def lrs(schedule: ScheduleConf, total: int, base: float = 0.1) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    sched = build_scheduler(schedule, opt, total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_constant_schedule():
    assert lrs(ScheduleConf(name="none"), 5) == [0.1] * 5


def test_linear_warmup_then_constant():
    assert lrs(ScheduleConf(name="none", warmup_steps=4), 6) == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])


def test_step_decay_after_warmup():
    got = lrs(ScheduleConf(name="step", warmup_steps=2, step_size=3, gamma=0.5), 10)
    assert got == pytest.approx([0.05, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025])


def test_cosine_reaches_min_ratio_at_the_end():
    total, warmup = 12, 2
    sched = ScheduleConf(name="cosine", warmup_steps=warmup, min_lr_ratio=0.1)
    factor = lr_multiplier(sched, total)
    assert factor(warmup) == pytest.approx(1.0)
    assert factor(total) == pytest.approx(0.1)
    mid = warmup + (total - warmup) / 2
    assert factor(int(mid)) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_adam_vs_adamw_weight_decay():
    p = torch.nn.Parameter(torch.ones(3))
    assert type(build_optimizer(AdamConf(weight_decay=0.1), [p])) is torch.optim.Adam
    assert type(build_optimizer(AdamConf(weight_decay=0.1, decoupled_weight_decay=True), [p])) is torch.optim.AdamW


def test_adamw_decays_the_weight_by_lr_times_wd_with_zero_gradient():
    p = torch.nn.Parameter(torch.ones(3))
    opt = build_optimizer(AdamConf(lr=0.1, weight_decay=0.5, decoupled_weight_decay=True), [p])
    p.grad = torch.zeros(3)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((3,), 1 - 0.1 * 0.5))


def test_sgd_options_reach_the_optimizer():
    p = torch.nn.Parameter(torch.ones(3))
    opt = build_optimizer(SGDConf(lr=0.2, momentum=0.5, nesterov=True, weight_decay=0.01), [p])
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (0.2, 0.5, True, 0.01)


def test_frozen_parameters_are_left_out():
    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1), requires_grad=False)
    opt = build_optimizer(SGDConf(), [a, b])
    assert opt.param_groups[0]["params"] == [a]


def test_multistep_decays_at_each_milestone_after_warmup():
    got = lrs(ScheduleConf(name="multistep", warmup_steps=2, milestones=[2, 5], gamma=0.5), 10)
    assert got == pytest.approx([0.05, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025])


def test_eden_from_config_follows_icefall_formula():
    schedule = ScheduleConf(name="eden", warmup_steps=4, warmup_start=0.5, lr_batches=10.0, lr_epochs=2.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(schedule, opt, total_steps=100)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)  # warmup starts at half the lr
    for _ in range(20):
        sched.step()
    sched.step_epoch()
    expected = ((20**2 + 10**2) / 10**2) ** -0.25 * ((1 + 2**2) / 2**2) ** -0.25
    assert opt.param_groups[0]["lr"] == pytest.approx(expected)


def test_scaled_adam_from_config():
    from mtl_bench.config import ScaledAdamConf
    from mtl_bench.optim import ScaledAdam

    opt = build_optimizer(ScaledAdamConf(lr=0.01, clipping_scale=None, compile="false"), [torch.nn.Parameter(torch.ones(4, 4))])
    assert isinstance(opt, ScaledAdam) and opt.compile is False and opt.param_groups[0]["betas"] == (0.9, 0.98)
