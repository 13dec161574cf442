"""Eden and Eden2 against icefall's formulas."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.optim import Eden, Eden2


def sgd(lrs: tuple[float, ...] = (0.04, 0.01)) -> torch.optim.SGD:
    return torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs])


def eden(
    batch: int, epoch: int, lr_batches: float = 100.0, lr_epochs: float = 3.0, warmup: float = 50.0, start: float = 0.5
) -> float:
    w = 1.0 if batch >= warmup else start + (1 - start) * batch / warmup
    return (
        ((batch**2 + lr_batches**2) / lr_batches**2) ** -0.25 * ((epoch**2 + lr_epochs**2) / lr_epochs**2) ** -0.25 * w
    )


@pytest.mark.parametrize("batch,epoch", [(0, 0), (10, 0), (49, 1), (50, 1), (300, 2), (5000, 7)])
def test_eden_matches_formula(batch, epoch):
    opt = sgd()
    sched = Eden(opt, lr_batches=100, lr_epochs=3, warmup_batches=50)
    sched.step_epoch(epoch)
    sched.step_batch(batch)
    want = [0.04 * eden(batch, epoch), 0.01 * eden(batch, epoch)]
    assert [g["lr"] for g in opt.param_groups] == pytest.approx(want, rel=1e-12)
    assert sched.get_last_lr() == pytest.approx(want, rel=1e-12)


def test_eden_hand_values():
    opt = sgd((1.0,))
    sched = Eden(opt, lr_batches=100, lr_epochs=3, warmup_batches=50)
    assert opt.param_groups[0]["lr"] == 0.5  # warmup starts at half the lr
    sched.step_batch(100)
    sched.step_epoch(3)
    assert opt.param_groups[0]["lr"] == pytest.approx(2**-0.5)  # 2^-0.25 * 2^-0.25, warmup over


def test_eden2_matches_formula_and_counts_batches():
    opt = sgd()
    sched = Eden2(opt, lr_batches=100, warmup_batches=10, warmup_start=0.2)
    for _ in range(7):
        sched.step_batch()
    assert sched.batch == 7
    w = 0.2 + 0.8 * 7 / 10
    assert opt.param_groups[0]["lr"] == pytest.approx(0.04 * ((49 + 1e4) / 1e4) ** -0.5 * w, rel=1e-12)
    sched.step_batch(200)  # 1/sqrt(5) after warmup
    assert opt.param_groups[1]["lr"] == pytest.approx(0.01 * 5**-0.5, rel=1e-12)


def test_state_dict_round_trip_and_resume():
    opt = sgd()
    sched = Eden(opt, lr_batches=100, lr_epochs=3)
    for _ in range(30):
        sched.step()
    sched.step_epoch()
    state = sched.state_dict()
    assert state == {"base_lrs": [0.04, 0.01], "batch": 30, "epoch": 1}
    # a resumed run: the optimizer comes back with the decayed lr, the schedule with its counters
    opt2 = sgd((0.0, 0.0))
    opt2.load_state_dict(opt.state_dict())
    sched2 = Eden(opt2, lr_batches=100, lr_epochs=3)
    sched2.load_state_dict(state)
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]
    sched.step_batch()
    sched2.step_batch()
    assert sched2.get_last_lr() == sched.get_last_lr()


def test_bad_arguments():
    with pytest.raises(ValueError, match="warmup_start"):
        Eden(sgd(), lr_batches=10, lr_epochs=2, warmup_start=1.5)
    with pytest.raises(ValueError, match="lr_batches"):
        Eden2(sgd(), lr_batches=0)
    with pytest.raises(TypeError):
        Eden2(object(), lr_batches=10)  # type: ignore[arg-type]
