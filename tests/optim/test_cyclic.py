"""Cyclic lr and momentum (mmcv CyclicLrUpdaterHook / CyclicMomentumUpdaterHook), values computed by hand."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.engine.builders import build
from mtl_bench.optim import CyclicSchedule


def sgd(lr: float = 0.1, momentum: float = 0.95) -> torch.optim.SGD:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr, momentum=momentum)


def trace(schedule: CyclicSchedule, steps: int) -> list[tuple[float, float]]:
    group = schedule.optimizer.param_groups[0]
    out = []
    for _ in range(steps):
        out.append((group["lr"], group["betas"][0] if "betas" in group else group["momentum"]))
        schedule.step()
    return out


def test_cosine_cycle_matches_hand_values():
    # 10 steps, one cycle, 40% up: lr 0.1 -> 1.0 over steps 0..4, then -> 1e-5 over steps 4..10
    got = trace(CyclicSchedule(sgd(), total_steps=10), 10)
    lrs = [lr for lr, _ in got]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[2] == pytest.approx(0.55)  # halfway up: 0.1 * (10 + 0.5 * (1 - 10) * (cos(pi/2) + 1))
    assert lrs[4] == pytest.approx(1.0)
    assert lrs[7] == pytest.approx(0.1 * (1e-4 + 0.5 * (10 - 1e-4)))  # halfway down
    momenta = [m for _, m in got]
    # momentum moves the other way: 0.95 -> 0.85 -> 0.95
    assert momenta[0] == pytest.approx(0.95) and momenta[2] == pytest.approx(0.90) and momenta[4] == pytest.approx(0.85)
    assert momenta[7] == pytest.approx(0.90)


def test_linear_strategy_and_several_cycles():
    sched = CyclicSchedule(
        sgd(lr=1.0),
        total_steps=20,
        target_ratio=(3.0, 1.0),
        cyclic_times=2,
        step_ratio_up=0.5,
        anneal_strategy="linear",
        momentum_target_ratio=None,
    )
    got = trace(sched, 22)
    lrs = [lr for lr, _ in got]
    assert lrs[:10] == pytest.approx([1.0, 1.4, 1.8, 2.2, 2.6, 3.0, 2.6, 2.2, 1.8, 1.4])
    assert lrs[10:20] == pytest.approx(lrs[:10])  # the second cycle repeats the first
    assert lrs[20:] == pytest.approx([1.4, 1.4])  # past the last cycle the end value stays
    assert all(m == 0.95 for _, m in got)  # momentum_target_ratio None: fixed


def test_adam_beta1_cycles_and_beta2_stays():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.1, betas=(0.95, 0.999))
    sched = CyclicSchedule(opt, total_steps=10)
    for _ in range(4):
        sched.step()
    assert opt.param_groups[0]["betas"] == pytest.approx((0.85, 0.999))


def test_state_dict_resumes_the_position():
    first = CyclicSchedule(sgd(), total_steps=10)
    for _ in range(4):
        first.step()
    opt = sgd()
    second = CyclicSchedule(opt, total_steps=10)
    second.load_state_dict(first.state_dict())
    assert second.get_last_lr() == pytest.approx([1.0]) and opt.param_groups[0]["momentum"] == pytest.approx(0.85)


def test_built_from_config(compose_cfg):
    opt = sgd()
    node = compose_cfg("optim=sgd", "optim/schedule=cyclic", "optim.schedule.target_ratio=[10.0,1e-4]").optim.schedule
    sched = build("optim.schedule", node, None, optimizer=opt, total_steps=10)
    assert isinstance(sched, CyclicSchedule)
    assert [lr for lr, _ in trace(sched, 5)][4] == pytest.approx(1.0)
