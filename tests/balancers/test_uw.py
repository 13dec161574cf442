"""UncertaintyWeighting: the update by hand, exactness against LibMTL 1.1.5's UW, resume, AMP skips, per-task mode."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mtl_bench.balancers import BackwardContext, UncertaintyWeighting
from mtl_bench.models.base import MultiTaskModel
from tests.helpers.balancer_kit import (
    TASKS,
    assert_ddp_is_one_process_on_the_whole_batch,
    assert_resume_continues,
    assert_scaler_is_fp32_and_a_skip_changes_nothing,
    libmtl_module,
    metrics_without_host_sync,
    pair_losses,
    pair_model,
)

# ---------------------------------------------------------------------------------------------- the formula


def test_one_update_by_hand():
    shared = torch.zeros(1, requires_grad=True)
    losses = {"a": (2.0 + shared).sum(), "b": (0.5 + 3 * shared).sum()}  # L = (2, 0.5), dL/dshared = (1, 3)
    bal = UncertaintyWeighting(list(TASKS), init_log_var=0.0, lr=0.1, optimizer="sgd")
    metrics = bal.backward(losses, shared)
    # w = 1/(2e^0) = 0.5 each: shared.grad = 0.5·1 + 0.5·3. ∂/∂s = 1/2 − L/(2e^s) = (−0.5, 0.25).
    assert shared.grad.item() == pytest.approx(2.0)
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == [0.5, 0.5]
    assert [metrics[f"uw/log_var/{t}"].item() for t in TASKS] == [0.0, 0.0]
    assert bal.weighting.log_vars.tolist() == pytest.approx([0.05, -0.025])
    assert bal.weighting.weights.tolist() == pytest.approx([0.5 * math.exp(-0.05), 0.5 * math.exp(0.025)])


def test_update_equals_autograd_of_the_objective():
    """The closed-form gradient against autograd of LibMTL's Σ L/(2e^s) + s/2, with Adam and weight decay."""
    s = torch.tensor([-0.5, 0.3], requires_grad=True)
    opt = torch.optim.Adam([s], lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    bal = UncertaintyWeighting(list(TASKS), lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    bal.weighting.log_vars.copy_(s.detach())
    for values in ((2.0, 0.5), (1.5, 0.7), (1.0, 0.2)):
        L = torch.tensor(values)
        opt.zero_grad()
        (L / (2 * s.exp()) + s / 2).sum().backward()
        opt.step()
        shared = torch.zeros(1, requires_grad=True)
        bal.backward({t: (v + shared).sum() for t, v in zip(TASKS, values)}, shared)
        torch.testing.assert_close(bal.weighting.log_vars, s.detach(), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------- the reference


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_matches_libmtl_uw(optimizer: str):
    """LibMTL's UW holds the log-variances as parameters of the model, stepped by the model's optimizer;
    ours steps them itself with the same optimizer settings: the same parameters after 6 steps."""
    module = libmtl_module("UW")
    ref_model, ref = pair_model(), module.UW()
    ref.task_num, ref.device = len(TASKS), "cpu"
    ref.init_param()
    make = (lambda p: torch.optim.Adam(p, lr=0.05)) if optimizer == "adam" else (lambda p: torch.optim.SGD(p, lr=0.05))
    ref_opt = make([*ref_model.parameters(), ref.loss_scale])
    model = pair_model()
    opt = make(model.parameters())
    bal = UncertaintyWeighting(list(TASKS), lr=0.05, optimizer=optimizer)
    for step in range(6):
        ref_opt.zero_grad()
        _, losses = pair_losses(ref_model, step)
        ref.backward(torch.stack([losses[t] for t in TASKS]))
        ref_opt.step()
        opt.zero_grad()
        out, losses = pair_losses(model, step)
        bal.backward(losses, out.shared, BackwardContext())
        opt.step()
        bal.step()
    torch.testing.assert_close(bal.weighting.log_vars, ref.loss_scale.detach(), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(bal.weighting.log_vars, torch.full((2,), -0.5), atol=1e-2)  # the state matters
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------- the contract


def test_state_dict_round_trip_continues_identically():
    saved, _ = assert_resume_continues(lambda model: UncertaintyWeighting(list(TASKS), lr=0.05), range(3), range(3, 6))
    assert {f"weighting.{k}" for k in ("log_vars", "exp_avg", "exp_avg_sq", "opt_step")} <= set(saved)


def test_grad_scaler_gives_the_fp32_update_and_a_skipped_step_changes_nothing():
    assert_scaler_is_fp32_and_a_skip_changes_nothing(lambda model: UncertaintyWeighting(list(TASKS), lr=0.05), range(3))


def test_per_task_mode_and_accumulation_give_the_joint_update():
    model, joint = pair_model(), UncertaintyWeighting(list(TASKS), lr=0.05)
    out, losses = pair_losses(model, 0)
    expected = joint.backward(losses, out.shared)
    expected_grads = [p.grad.clone() for p in model.parameters()]

    model, bal = pair_model(), UncertaintyWeighting(list(TASKS), lr=0.05)
    metrics: dict[str, torch.Tensor] = {}
    for task in ("b", "a"):
        out, losses = pair_losses(model, 0)
        metrics |= bal.backward_task(task, losses[task], out.shared, BackwardContext())
    assert torch.equal(bal.weighting.log_vars, torch.full((2,), -0.5))  # staged until step()
    metrics |= bal.step()
    assert metrics.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(metrics[key], expected[key])
    torch.testing.assert_close(bal.weighting.log_vars, joint.weighting.log_vars)
    for g, ref in zip((p.grad for p in model.parameters()), expected_grads):
        torch.testing.assert_close(g, ref)

    # Two micro-batches of half the batch: the update from the mean loss, as one batch of the mean.
    bal = UncertaintyWeighting(list(TASKS), lr=0.05)
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    halves = ({"a": torch.tensor(2.0), "b": torch.tensor(0.25)}, {"a": torch.tensor(1.0), "b": torch.tensor(0.75)})
    for half in halves:
        shared = torch.zeros(1, requires_grad=True)
        bal.backward({t: v + shared.sum() for t, v in half.items()}, shared, ctx)
    bal.step()
    one = UncertaintyWeighting(list(TASKS), lr=0.05)
    shared = torch.zeros(1, requires_grad=True)
    one.backward({"a": torch.tensor(1.5) + shared.sum(), "b": torch.tensor(0.5) + shared.sum()}, shared)
    torch.testing.assert_close(bal.weighting.log_vars, one.weighting.log_vars)


def test_metrics_and_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    metrics = metrics_without_host_sync(UncertaintyWeighting(list(TASKS)), monkeypatch)
    assert set(metrics) == {f"{family}/{t}" for family in ("weight", "uw/log_var") for t in TASKS}


def DDP_BALANCER(names: list[str], model: MultiTaskModel):  # noqa: N802 (read by the spawned workers)
    return UncertaintyWeighting(names, lr=0.05)


DDP_STEPS = 4


@pytest.mark.slow  # two spawned processes: about 25 s on 2 shared cores
def test_ddp_ranks_hold_the_state_of_one_process_on_the_whole_batch(tmp_path: Path):
    assert_ddp_is_one_process_on_the_whole_batch(tmp_path, DDP_BALANCER, DDP_STEPS)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lr": -1}, "lr: must be a number > 0, got -1"),
        ({"optimizer": "lbfgs"}, "optimizer: 'lbfgs' is not one of adam, sgd"),
        ({"weight_decay": -0.1}, "weight_decay: must be a number >= 0"),
        ({"betas": (0.9, 1.0)}, "betas: must be two numbers in [0, 1)"),
        ({"eps": 0.0}, "eps: must be a number > 0"),
        ({"init_log_var": float("nan")}, "init_log_var: must be a finite number, got nan"),
        ({"init_log_var": float("inf")}, "init_log_var: must be a finite number, got inf"),
    ],
)
def test_bad_options_name_their_argument(options, message):
    with pytest.raises(ValueError) as info:
        UncertaintyWeighting(list(TASKS), **options)
    assert str(info.value).startswith(message)
