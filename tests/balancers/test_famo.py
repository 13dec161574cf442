"""FAMO: the update by hand, exactness against FAMO's own code (numbers taken from it), resume, AMP skips."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mtl_bench.balancers import FAMO, BackwardContext
from mtl_bench.models.base import MultiTaskModel
from tests.helpers.balancer_kit import (
    TASKS,
    X,
    Y,
    assert_ddp_is_one_process_on_the_whole_batch,
    assert_resume_continues,
    assert_scaler_is_fp32_and_a_skip_changes_nothing,
    constant_losses,
    metrics_without_host_sync,
    pair_losses,
    pair_model,
)

# ---------------------------------------------------------------------------------------------- the formula


def test_two_steps_by_hand():
    bal = FAMO(list(TASKS), lr=0.025, gamma=0.0)
    # Step 1: ξ = 0, z = (1/2, 1/2), D = L = (2, 1/2): c = Σ z/D = 1.25, w = z/(c·D) = (0.2, 0.8).
    losses, shared = constant_losses(2.0, 0.5)
    metrics = bal.backward(losses, shared)
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == pytest.approx([0.2, 0.8])
    assert [metrics[f"famo/z/{t}"].item() for t in TASKS] == [0.5, 0.5]
    assert shared.grad.item() == pytest.approx(1.0)
    assert bal.weighting.logits.tolist() == [0.0, 0.0] and bal.weighting.prev_losses.tolist() == [2.0, 0.5]
    # Step 2: δ = log D(before) − log D(now) = (log 2, 0); Jᵀδ = z∘(δ − z·δ) = (log 2 / 4, −log 2 / 4);
    # Adam's first step moves each logit by lr against its gradient's sign: ξ = (−0.025, 0.025).
    losses, shared = constant_losses(1.0, 0.5)
    metrics = bal.backward(losses, shared)
    assert bal.weighting.logits.tolist() == pytest.approx([-0.025, 0.025], abs=1e-6)
    z = [1 / (1 + math.exp(0.05)), 1 / (1 + math.exp(-0.05))]
    c = z[0] / 1.0 + z[1] / 0.5
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == pytest.approx([z[0] / c, z[1] / (c * 0.5)])


# ---------------------------------------------------------------------------------------------- the reference

# Cranial-XIX/FAMO at commit 0a6ad06dbdd55fce73ec01e3a175c2498cd1e5e9, `famo.py`: FAMO(n_tasks=2, gamma=0.01,
# w_lr=0.025) with set_min_losses([0.05, 0.2]), this model and the full batch (all 8 rows) every step, SGD lr 0.1,
# their loop: backward(losses), opt.step(), update(losses after the step on the same batch); 6 steps.
# (LibMTL main's FAMO gives the same numbers.) With one batch, our "after" losses (the next step's) are theirs.
FAMO_PARAMS_AFTER_6 = {
    "trunk.0.weight": [
        0.302948534488678,
        -0.03934989497065544,
        0.5221859812736511,
        -0.3877417743206024,
        -0.006313893012702465,
        0.22755341231822968,
        0.14705462753772736,
        0.36535876989364624,
        -0.3002256751060486,
        -0.10241682827472687,
        -0.3130369186401367,
        0.23670944571495056,
    ],
    "trunk.0.bias": [0.02242877334356308, -0.08369526267051697, 0.19711773097515106, -0.018941959366202354],
    "heads.a.weight": [0.3754064440727234, -0.27167120575904846, 0.29066580533981323, 0.38477903604507446],
    "heads.a.bias": [0.04516211897134781],
    "heads.b.weight": [
        -0.2033984512090683,
        0.30498653650283813,
        0.4683329463005066,
        -0.15728525817394257,
        0.2964640259742737,
        0.05821738392114639,
        -0.3489009141921997,
        0.2023087441921234,
    ],
    "heads.b.bias": [-0.01902749016880989, 0.1481221318244934],
}
FAMO_LOGITS_AFTER_5_UPDATES = [-0.12059574574232101, 0.12059573829174042]  # the update after step 6 is our step 7's


def test_matches_famo_reference_numbers():
    model = pair_model()
    bal = FAMO(list(TASKS), lr=0.025, gamma=0.01, min_losses={"a": 0.05, "b": 0.2})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(6):
        opt.zero_grad()
        out = model(X)
        bal.backward({t: F.mse_loss(out.preds[t], Y[t]) for t in TASKS}, out.shared, BackwardContext())
        opt.step()
        bal.step()
    torch.testing.assert_close(bal.weighting.logits, torch.tensor(FAMO_LOGITS_AFTER_5_UPDATES), rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            p.detach().flatten(), torch.tensor(FAMO_PARAMS_AFTER_6[name]), rtol=1e-5, atol=1e-6, msg=name
        )


def test_update_equals_autograd_through_the_softmax_and_torch_adam():
    """Our closed-form Jᵀδ and Adam step against FAMO's own formulation with torch.optim.Adam(weight_decay)."""
    xi = torch.zeros(2, requires_grad=True)
    opt = torch.optim.Adam([xi], lr=0.025, weight_decay=0.01)
    bal = FAMO(list(TASKS), lr=0.025, gamma=0.01)
    history = ((2.0, 0.5), (1.5, 0.6), (1.4, 0.3), (0.9, 0.35))
    for before, after in zip(history, history[1:]):
        delta = torch.log(torch.tensor(before) + 1e-8) - torch.log(torch.tensor(after) + 1e-8)
        (d,) = torch.autograd.grad(torch.softmax(xi, -1), xi, grad_outputs=delta)
        opt.zero_grad()
        xi.grad = d
        opt.step()
    for values in history:
        losses, shared = constant_losses(*values)
        bal.backward(losses, shared)
    torch.testing.assert_close(bal.weighting.logits, xi.detach(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- the contract


def test_state_dict_round_trip_continues_identically():
    saved, _ = assert_resume_continues(lambda model: FAMO(list(TASKS), lr=0.1), range(3), range(3, 6))
    assert {
        f"weighting.{k}"
        for k in ("logits", "exp_avg", "exp_avg_sq", "opt_step", "prev_losses", "has_prev", "min_losses")
    } <= set(saved)


def test_grad_scaler_gives_the_fp32_update_and_a_skipped_step_changes_nothing():
    assert_scaler_is_fp32_and_a_skip_changes_nothing(lambda model: FAMO(list(TASKS), lr=0.1), range(4))


def test_accumulation_commits_the_update_of_the_steps_mean_loss():
    bal, one = FAMO(list(TASKS), lr=0.1), FAMO(list(TASKS), lr=0.1)
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    for halves in (((2.0, 1.0), (4.0, 3.0)), ((1.0, 1.0), (2.0, 2.5)), ((0.5, 1.5), (1.0, 1.5))):
        for a, b in halves:
            losses, shared = constant_losses(a, b)
            metrics = bal.backward(losses, shared, ctx)
        bal.step()
        losses, shared = constant_losses(*[sum(v) / 2 for v in zip(*halves)])
        expected = one.backward(losses, shared)
        for key in expected:  # the last micro-batch is weighted as the whole step
            torch.testing.assert_close(metrics[key], expected[key])
    for key, value in one.state_dict().items():
        torch.testing.assert_close(bal.state_dict()[key], value, msg=key)


def test_per_task_mode_is_refused_in_one_line():
    model, bal = pair_model(), FAMO(list(TASKS))
    out, losses = pair_losses(model, 0)
    with pytest.raises(NotImplementedError, match="FAMO has no per-task mode.*step_mode=joint"):
        bal.backward_task("a", losses["a"], out.shared, BackwardContext())


def test_metrics_and_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    metrics = metrics_without_host_sync(FAMO(list(TASKS)), monkeypatch, per_task=False)
    assert set(metrics) == {f"{family}/{t}" for family in ("weight", "famo/z") for t in TASKS}


def DDP_BALANCER(names: list[str], model: MultiTaskModel):  # noqa: N802 (read by the spawned workers)
    return FAMO(names, lr=0.1)


DDP_STEPS = 4


@pytest.mark.slow  # two spawned processes: about 25 s on 2 shared cores
def test_ddp_ranks_hold_the_state_of_one_process_on_the_whole_batch(tmp_path: Path):
    assert_ddp_is_one_process_on_the_whole_batch(tmp_path, DDP_BALANCER, DDP_STEPS)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lr": -1}, "lr: must be a number > 0, got -1"),
        ({"lr": "fast"}, "lr: must be a number > 0, got 'fast'"),
        ({"gamma": -0.1}, "gamma: must be a number >= 0"),
        ({"eps": 0.0}, "eps: must be a number > 0"),
        ({"loss_eps": 0.0}, "loss_eps: must be a number > 0"),
        ({"min_losses": {"a": 0.0}}, "min_losses: tasks ['a'] do not match"),
        ({"betas": (1.0, 0.9)}, "betas: must be two numbers in [0, 1), got (1.0, 0.9)"),
        ({"betas": (0.9,)}, "betas: must be two numbers in [0, 1)"),
    ],
)
def test_bad_options_name_their_argument(options, message):
    with pytest.raises(ValueError) as info:
        FAMO(list(TASKS), **options)
    assert str(info.value).startswith(message)
