"""Optimizers (torch.optim classes built from conf/optim) and the LR schedules (conf/optim/schedule),
checked against their formulas."""

from __future__ import annotations

import math

import pytest
import torch

from mtl_bench.engine.builders import build
from mtl_bench.errors import ConfigError
from mtl_bench.optim import Cosine, Eden, ScaledAdam, build_param_groups


@pytest.fixture
def schedule(compose_cfg):
    """The schedule node of `optim/schedule=<option>` with `optim.schedule.KEY=VALUE` overrides."""
    return lambda option, **values: (
        compose_cfg(f"optim/schedule={option}", *(f"optim.schedule.{k}={v}" for k, v in values.items())).optim.schedule
    )


@pytest.fixture
def optimizer(compose_cfg):
    """The optimizer of `optim=<option>` with `optim.KEY=VALUE` overrides, built as the engine builds it."""

    def make(option, params, **values):
        node = compose_cfg(f"optim={option}", *(f"optim.{k}={v}" for k, v in values.items())).optim
        return build("optim", node, torch.optim.Optimizer, ignore=("schedule", "paramwise"), params=params)

    return make


def lrs(node, total: int, base: float = 0.1) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    sched = build("optim.schedule", node, None, optimizer=opt, total_steps=total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_constant_schedule(schedule):
    assert lrs(schedule("none"), 5) == [0.1] * 5


def test_linear_warmup_then_constant(schedule):
    assert lrs(schedule("none", warmup_steps=4), 6) == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])


def test_step_decay_after_warmup(schedule):
    got = lrs(schedule("step", warmup_steps=2, step_size=3, gamma=0.5), 10)
    assert got == pytest.approx([0.05, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025])


def test_cosine_reaches_min_ratio_at_the_end(schedule):
    total, warmup = 12, 2
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = build(
        "optim.schedule",
        schedule("cosine", warmup_steps=warmup, min_lr_ratio=0.1),
        None,
        optimizer=opt,
        total_steps=total,
    )
    assert isinstance(sched, Cosine)
    factor = sched.factor
    assert factor(warmup) == pytest.approx(1.0)
    assert factor(total) == pytest.approx(0.1)
    mid = warmup + (total - warmup) / 2
    assert factor(int(mid)) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_adam_vs_adamw_weight_decay(optimizer):
    # optim=adam adds L2 to the gradient; decoupled weight decay is its own option, optim=adamw
    p = torch.nn.Parameter(torch.ones(3))
    assert type(optimizer("adam", [p], weight_decay=0.1)) is torch.optim.Adam
    assert type(optimizer("adamw", [p], weight_decay=0.1)) is torch.optim.AdamW


def test_adamw_decays_the_weight_by_lr_times_wd_with_zero_gradient(optimizer):
    p = torch.nn.Parameter(torch.ones(3))
    opt = optimizer("adamw", [p], lr=0.1, weight_decay=0.5)
    p.grad = torch.zeros(3)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((3,), 1 - 0.1 * 0.5))


def test_sgd_options_reach_the_optimizer(optimizer):
    p = torch.nn.Parameter(torch.ones(3))
    opt = optimizer("sgd", [p], lr=0.2, momentum=0.5, nesterov="true", weight_decay=0.01)
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (0.2, 0.5, True, 0.01)


def test_frozen_parameters_are_left_out(optimizer):
    # The engine hands the optimizer build_param_groups(model, ...), which leaves frozen parameters out.
    model = torch.nn.Module()
    model.a, model.b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1), requires_grad=False)
    a = model.a
    opt = optimizer("sgd", build_param_groups(model, 0.01, 0.0, None))
    assert opt.param_groups[0]["params"] == [a]


def test_multistep_decays_at_each_milestone_after_warmup(schedule):
    got = lrs(schedule("multistep", warmup_steps=2, milestones="[2,5]", gamma=0.5), 10)
    assert got == pytest.approx([0.05, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025])


def test_eden_from_config_follows_icefall_formula(schedule):
    node = schedule("eden", warmup_batches=4, warmup_start=0.5, lr_batches=10.0, lr_epochs=2.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build("optim.schedule", node, None, optimizer=opt, total_steps=100)
    assert isinstance(sched, Eden)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)  # warmup starts at half the lr
    for _ in range(20):
        sched.step()
    sched.step_epoch()
    expected = ((20**2 + 10**2) / 10**2) ** -0.25 * ((1 + 2**2) / 2**2) ** -0.25
    assert opt.param_groups[0]["lr"] == pytest.approx(expected)


def test_scaled_adam_from_config(optimizer):
    opt = optimizer(
        "scaled_adam", [torch.nn.Parameter(torch.ones(4, 4))], lr=0.01, clipping_scale="null", kernel="false"
    )
    assert isinstance(opt, ScaledAdam) and opt.kernel is False and opt.param_groups[0]["betas"] == (0.9, 0.98)


def test_scaled_adam_kernel_true_that_cannot_be_had_is_one_line_naming_the_key(optimizer):
    params = [torch.nn.Parameter(torch.ones(4, 4, dtype=torch.bfloat16))]
    with pytest.raises(ConfigError) as err:
        optimizer("scaled_adam", params, kernel="true")
    message = str(err.value)
    assert message.startswith("optim.kernel: true needs float32 contiguous CPU parameters") and "\n" not in message
