"""DynamicWeightAverage: the weights by hand, exactness against LibMTL 1.1.5's DWA, resume, AMP skips, per-task mode."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mtl_bench.balancers import BackwardContext, DynamicWeightAverage
from mtl_bench.models.base import MultiTaskModel
from tests.helpers.balancer_kit import (
    TASKS,
    X,
    Y,
    assert_ddp_is_one_process_on_the_whole_batch,
    assert_resume_continues,
    assert_scaler_is_fp32_and_a_skip_changes_nothing,
    constant_losses,
    libmtl_module,
    metrics_without_host_sync,
    pair_losses,
    pair_model,
)

# ---------------------------------------------------------------------------------------------- the formula


def test_weights_by_hand():
    bal = DynamicWeightAverage(list(TASKS), temperature=2.0, period=2)
    # Period 0: a = (4, 2), b = (1, 1) -> means (3, 1); period 1: a = (1.5, 1.5), b = (2, 0) -> (1.5, 1).
    for a, b in ((4.0, 1.0), (2.0, 1.0), (1.5, 2.0), (1.5, 0.0)):
        losses, shared = constant_losses(a, b)
        metrics = bal.backward(losses, shared)
        assert [metrics[f"weight/{t}"].item() for t in TASKS] == [1.0, 1.0]  # fewer than two complete periods
    assert (
        bal.weighting.periods.item() == 2
        and bal.weighting.last.tolist() == [1.5, 1.0]
        and bal.weighting.before_last.tolist() == [3.0, 1.0]
    )
    losses, shared = constant_losses(1.0, 1.0)
    metrics = bal.backward(losses, shared)
    r = [0.5, 1.0]  # rates L̄(1)/L̄(0)
    e = [math.exp(x / 2.0) for x in r]
    expected = [2 * v / sum(e) for v in e]
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == pytest.approx(expected)
    assert [metrics[f"dwa/rate/{t}"].item() for t in TASKS] == pytest.approx(r)
    torch.testing.assert_close(shared.grad, torch.tensor([sum(expected)]))


def test_period_averages_weight_steps_by_batch_size():
    bal = DynamicWeightAverage(list(TASKS), period=2)
    for a, items in ((1.0, 3), (5.0, 1)):
        losses, shared = constant_losses(a, 1.0, items)
        bal.backward(losses, shared)
    assert bal.weighting.last.tolist() == [pytest.approx((3 * 1.0 + 1 * 5.0) / 4), 1.0]


# ---------------------------------------------------------------------------------------------- the reference

BATCHES = (3, 3, 2)  # one epoch: 8 items in batches of 3, 3, 2 (LibMTL weights epoch means by batch size)


def epoch_rows(epoch: int, batch: int) -> list[int]:
    start = sum(BATCHES[:batch])
    return [(5 * epoch + start + j) % 8 for j in range(BATCHES[batch])]


def test_matches_libmtl_dwa_with_period_equal_to_an_epoch():
    module = libmtl_module("DWA")
    epochs = 5
    ref_model, ref = pair_model(), module.DWA()
    ref.task_num, ref.device, ref.train_loss_buffer = len(TASKS), "cpu", np.zeros([len(TASKS), epochs])
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    model, bal = pair_model(), DynamicWeightAverage(list(TASKS), temperature=2.0, period=len(BATCHES))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = []
    for epoch in range(epochs):
        ref.epoch = epoch
        record: dict[str, list[tuple[float, int]]] = {t: [] for t in TASKS}
        for batch in range(len(BATCHES)):
            idx = epoch_rows(epoch, batch)
            out = ref_model(X[idx])
            losses = [F.mse_loss(out.preds[t], Y[t][idx]) for t in TASKS]
            for t, loss in zip(TASKS, losses):
                record[t].append((loss.item(), len(idx)))  # LibMTL's AbsLoss._update_loss
            ref_opt.zero_grad()
            ref_weights = ref.backward(torch.stack(losses), T=2.0)
            ref_opt.step()

            opt.zero_grad()
            out = model(X[idx])
            metrics = bal.backward(
                {t: F.mse_loss(out.preds[t], Y[t][idx]) for t in TASKS}, out.shared, BackwardContext()
            )
            opt.step()
            bal.step()
            weights.append([metrics[f"weight/{t}"].item() for t in TASKS])
            np.testing.assert_allclose(weights[-1], ref_weights, rtol=1e-5)
        for i, t in enumerate(TASKS):  # LibMTL's AbsLoss._average_loss
            values, sizes = np.array([v for v, _ in record[t]]), np.array([n for _, n in record[t]])
            ref.train_loss_buffer[i, epoch] = (values * sizes).sum() / sizes.sum()
    assert len({tuple(w) for w in weights}) > 3  # the weights moved in the last epochs
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------- the contract


def test_state_dict_round_trip_continues_identically():
    saved, straight = assert_resume_continues(
        lambda model: DynamicWeightAverage(list(TASKS), period=2), range(5), range(5, 10)
    )
    assert {
        f"weighting.{k}" for k in ("period_sum", "period_items", "period_steps", "periods", "last", "before_last")
    } <= set(saved)
    assert straight[-1]["weight/a"].item() != 1.0


def test_grad_scaler_gives_the_fp32_weights_and_a_skipped_step_changes_nothing():
    assert_scaler_is_fp32_and_a_skip_changes_nothing(
        lambda model: DynamicWeightAverage(list(TASKS), period=2), range(6)
    )


def test_per_task_mode_and_accumulation_give_the_joint_update():
    model, joint = pair_model(), DynamicWeightAverage(list(TASKS), period=1)
    per_task_model, bal = pair_model(), DynamicWeightAverage(list(TASKS), period=1)
    for step in range(4):
        out, losses = pair_losses(model, step)
        expected = joint.backward(losses, out.shared)
        metrics: dict[str, torch.Tensor] = {}
        for task in ("b", "a"):
            out, losses = pair_losses(per_task_model, step)
            metrics |= bal.backward_task(task, losses[task], out.shared, BackwardContext())
        metrics |= bal.step()
        assert metrics.keys() == expected.keys()
        for key in expected:
            torch.testing.assert_close(metrics[key], expected[key])
    for name in ("last", "before_last", "periods"):
        assert torch.equal(getattr(bal.weighting, name), getattr(joint.weighting, name)), name
    for g, ref in zip((p.grad for p in per_task_model.parameters()), (p.grad for p in model.parameters())):
        torch.testing.assert_close(g, ref)

    # Two micro-batches per step: the step's loss is their mean.
    bal, one = DynamicWeightAverage(list(TASKS), period=1), DynamicWeightAverage(list(TASKS), period=1)
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    for step_losses in (((2.0, 1.0), (4.0, 3.0)), ((1.0, 1.0), (2.0, 2.0))):
        for a, b in step_losses:
            losses, shared = constant_losses(a, b)
            bal.backward(losses, shared, ctx)
        bal.step()
        mean = [sum(v) / 2 for v in zip(*step_losses)]
        losses, shared = constant_losses(*mean)
        one.backward(losses, shared)
    torch.testing.assert_close(bal.weighting.last, one.weighting.last)
    torch.testing.assert_close(bal.weighting.before_last, one.weighting.before_last)


def test_metrics_and_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    metrics = metrics_without_host_sync(DynamicWeightAverage(list(TASKS), period=1), monkeypatch)
    assert set(metrics) == {f"{family}/{t}" for family in ("weight", "dwa/rate") for t in TASKS}


def DDP_BALANCER(names: list[str], model: MultiTaskModel):  # noqa: N802 (read by the spawned workers)
    return DynamicWeightAverage(names, period=2)


DDP_STEPS = 6


@pytest.mark.slow  # two spawned processes: about 25 s on 2 shared cores
def test_ddp_ranks_hold_the_state_of_one_process_on_the_whole_batch(tmp_path: Path):
    assert_ddp_is_one_process_on_the_whole_batch(tmp_path, DDP_BALANCER, DDP_STEPS)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": 0.0}, "temperature: must be a number > 0, got 0.0"),
        ({"temperature": -2}, "temperature: must be a number > 0, got -2"),  # T < 0 would favour the fast tasks
        ({"temperature": "2"}, "temperature: must be a number > 0, got '2'"),
        ({"period": 0}, "period: must be an integer >= 1, got 0"),
        ({"period": 2.5}, "period: must be an integer >= 1"),
    ],
)
def test_bad_options_name_their_argument(options, message):
    with pytest.raises(ValueError) as info:
        DynamicWeightAverage(list(TASKS), **options)
    assert str(info.value).startswith(message)
