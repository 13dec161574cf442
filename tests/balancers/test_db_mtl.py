"""DualBalancing (DB-MTL): the update by hand, exactness against LibMTL main's DB_MTL (numbers taken from it),
resume, AMP skips, per-task mode and accumulation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtl_bench.balancers import BackwardContext, DualBalancing
from mtl_bench.models.base import MultiTaskModel
from tests.helpers.balancer_kit import (
    TASKS,
    X,
    Y,
    assert_resume_continues,
    assert_scaler_is_fp32_and_a_skip_changes_nothing,
    metrics_without_host_sync,
    pair_losses,
    pair_model,
    pair_rows,
    run_ddp,
    train,
)


def db(model: MultiTaskModel, **options) -> DualBalancing:
    return DualBalancing(list(TASKS), shared_params=model.shared_parameters(), **options)


# ---------------------------------------------------------------------------------------------- the formula


def square_case(theta: nn.Parameter) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """L_a = θ0², L_b = 4θ1²: at θ = (1, 2), ∇ log L_a = (2/θ0, 0) = (2, 0), ∇ log L_b = (0, 2/θ1) = (0, 1)."""
    shared = theta * 1.0
    return {"a": shared[0] ** 2, "b": 4 * shared[1] ** 2}, shared


@pytest.mark.parametrize(("beta_sigma", "second_ema"), [(0.0, (0.38, 0.19)), (1.0, (1.19, 0.595))])
def test_two_steps_by_hand(beta_sigma: float, second_ema: tuple[float, float]):
    theta = nn.Parameter(torch.tensor([1.0, 2.0]))
    bal = DualBalancing(list(TASKS), shared_params=[theta], beta=0.9, beta_sigma=beta_sigma)
    # Step 1: m = g + 0.9·(0 − g) = 0.1·g: ‖m‖ = (0.2, 0.1), α = max/‖m‖ = (1, 2), Σ α_i m_i = (0.2, 0.2).
    metrics = bal.backward(*square_case(theta))
    assert theta.grad.tolist() == pytest.approx([0.2, 0.2])
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == pytest.approx([1.0, 2.0])
    assert [metrics[f"grad_norm/{t}"].item() for t in TASKS] == pytest.approx([2.0, 1.0])
    # Step 2: β_2 = 0.9 / 2^σ; m_a = 2 + β_2·(0.2 − 2), m_b = 1 + β_2·(0.1 − 1); α = (1, 2) again.
    theta.grad = None
    metrics = bal.backward(*square_case(theta))
    ema_a, ema_b = second_ema
    assert bal.aggregator.grad_ema.tolist() == [pytest.approx([ema_a, 0.0]), pytest.approx([0.0, ema_b])]
    assert [metrics[f"db_mtl/ema_norm/{t}"].item() for t in TASKS] == pytest.approx([ema_a, ema_b])
    assert theta.grad.tolist() == pytest.approx([ema_a, ema_a])


# ---------------------------------------------------------------------------------------------- the reference

# LibMTL main (github.com/median-research-group/LibMTL, commit 4336804847eaa5e0b924b743d76beec7ac3fdc97),
# LibMTL/weighting/DB_MTL.py with that commit's abstract_weighting.py, on this model (the trunk as LibMTL's
# encoder, zero_grad_share_params = encoder.zero_grad(set_to_none=False)), these batches, SGD lr 0.1, 5 steps of
# zero_grad(set_to_none=False); backward(losses, DB_beta=0.9, DB_beta_sigma=0.5); step().
DB_MTL_PARAMS_AFTER_5 = {
    "trunk.0.weight": [
        0.33501338958740234,
        -0.03307186812162399,
        0.501179575920105,
        -0.3151718080043793,
        0.045149121433496475,
        0.18854425847530365,
        0.11013064533472061,
        0.27446940541267395,
        -0.31334388256073,
        -0.07743512094020844,
        -0.304720014333725,
        0.22150875627994537,
    ],
    "trunk.0.bias": [-0.007069111336022615, -0.06741658598184586, 0.21949005126953125, -0.03337201848626137],
    "heads.a.weight": [0.34172308444976807, -0.17841562628746033, 0.25942346453666687, 0.3676469922065735],
    "heads.a.bias": [-0.030510589480400085],
    "heads.b.weight": [
        -0.2026347815990448,
        0.2856766879558563,
        0.475089967250824,
        -0.15520566701889038,
        0.2897907495498657,
        0.03313278406858444,
        -0.32530224323272705,
        0.17661184072494507,
    ],
    "heads.b.bias": [-0.015316978096961975, 0.1389695256948471],
}
DB_MTL_GRAD_BUFFER_AFTER_5 = [  # LibMTL's grad_buffer: one row per task, the trunk's weight then bias
    [
        -0.11196303367614746,
        -0.43114814162254333,
        -0.0031042098999023438,
        0.05229407548904419,
        0.18767113983631134,
        0.002892516553401947,
        -0.0576157420873642,
        -0.17978164553642273,
        -0.017072342336177826,
        -0.14197754859924316,
        -0.40617209672927856,
        -0.03756479173898697,
        -0.014883510768413544,
        0.007679430767893791,
        0.0010643086861819029,
        -0.02772653102874756,
    ],
    [
        -0.055138420313596725,
        -0.03779688477516174,
        0.00819442979991436,
        -0.06754077225923538,
        -0.01940752938389778,
        0.039413318037986755,
        0.04444266855716705,
        0.06862320005893707,
        0.03278833627700806,
        -0.04496415704488754,
        -0.028049025684595108,
        -0.006867539137601852,
        0.03459394723176956,
        -0.004853619262576103,
        -0.019055809825658798,
        0.007667917758226395,
    ],
]


def test_matches_libmtl_main_reference_numbers():
    model = pair_model()
    bal = db(model, beta=0.9, beta_sigma=0.5)
    train(model, bal, range(5), lr=0.1)
    torch.testing.assert_close(bal.aggregator.grad_ema, torch.tensor(DB_MTL_GRAD_BUFFER_AFTER_5), rtol=1e-5, atol=1e-6)
    assert bal.aggregator.steps.item() == 5
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            p.detach().flatten(), torch.tensor(DB_MTL_PARAMS_AFTER_5[name]), rtol=1e-5, atol=1e-6, msg=name
        )


# ---------------------------------------------------------------------------------------------- the contract


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_state_dict_round_trip_continues_identically():
    saved, _ = assert_resume_continues(lambda model: db(model, beta_sigma=0.5), range(3), range(3, 6))
    assert set(saved) == {"aggregator.grad_ema", "aggregator.steps"}


def test_grad_scaler_gives_the_fp32_update_and_a_skipped_step_changes_nothing():
    assert_scaler_is_fp32_and_a_skip_changes_nothing(db, range(3))


def test_fp16_autocast_with_scaler_measures_like_fp32():
    model = pair_model()
    out, losses = pair_losses(model, 0)
    expected = db(model).backward(losses, out.shared)
    model = pair_model()
    bal = db(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    idx = pair_rows(0)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(X[idx])
        losses = {t: F.mse_loss(out.preds[t].float(), Y[t][idx]) for t in TASKS}
    assert out.shared.dtype == torch.float16
    metrics = bal.backward(losses, out.shared, scaler)
    for key in expected:
        torch.testing.assert_close(metrics[key], expected[key], rtol=2e-2, atol=1e-4)
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def test_per_task_mode_gives_the_joint_gradients_and_state():
    joint_model = pair_model()
    joint = db(joint_model, beta_sigma=0.5)
    train(joint_model, joint, range(2))
    out, losses = pair_losses(joint_model, 2)
    joint_model.zero_grad()
    expected = joint.backward(losses, out.shared)

    model = pair_model()
    bal = db(model, beta_sigma=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        opt.zero_grad()
        metrics: dict[str, torch.Tensor] = {}
        for task in ("b", "a"):
            out, losses = pair_losses(model, step)
            metrics |= bal.backward_task(task, losses[task], out.shared, BackwardContext())
        if step < 2:
            opt.step()
        metrics |= bal.step()
    assert metrics.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(metrics[key], expected[key], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(bal.aggregator.grad_ema, joint.aggregator.grad_ema, rtol=1e-5, atol=1e-7)
    for g, ref in zip(grads(model), grads(joint_model)):
        torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-7)


def test_accumulation_averages_the_gradients_and_writes_once():
    one_model = pair_model()
    one = db(one_model)
    out, losses = pair_losses(one_model, 0)
    expected = one.backward(losses, out.shared)

    model = pair_model()
    bal = db(model)
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    out, losses = pair_losses(model, 0)
    assert bal.backward(losses, out.shared, ctx) == {}  # nothing written before the k-th backward
    assert all(p.grad is None for p in model.trunk.parameters())
    out, losses = pair_losses(model, 0)  # the same micro-batch again: the mean is the one batch's
    metrics = bal.backward(losses, out.shared, ctx)
    for key in expected:
        torch.testing.assert_close(metrics[key], expected[key])
    for g, ref in zip(grads(model), grads(one_model)):
        torch.testing.assert_close(g, ref)
    with pytest.raises(RuntimeError, match="still pending"):
        out, losses = pair_losses(model, 0)
        bal.backward(losses, out.shared, ctx)

    bal = db(model)
    out, losses = pair_losses(model, 0)
    bal.backward(losses, out.shared, ctx)
    with pytest.raises(RuntimeError, match="after 1 of 2 backwards"):
        bal.step()


def test_metrics_and_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    bal = db(pair_model())
    # A GPU's path: the staged EMA is committed by torch.where. On the CPU a kept buffer trades places with it,
    # which reads the step's flags (no device sync there); a buffer that is no kept spare takes the GPU's path.
    monkeypatch.setattr(bal.aggregator, "staging_buffer", lambda name, like: torch.empty_like(like))
    metrics = metrics_without_host_sync(bal, monkeypatch)
    families = ("weight", "grad_norm", "db_mtl/ema_norm")
    assert set(metrics) == {f"{family}/{t}" for family in families for t in TASKS}


def DDP_BALANCER(names: list[str], model: MultiTaskModel):  # noqa: N802 (read by the spawned workers)
    return DualBalancing(names, shared_params=model.shared_parameters(), beta_sigma=0.5)


DDP_STEPS = 3


@pytest.mark.slow  # two spawned processes: about 25 s on 2 shared cores
def test_ddp_ranks_hold_the_same_state(tmp_path: Path):
    """Two gloo ranks, each on its half of every batch (tasks listed in different orders): the per-task
    gradients are averaged across ranks before the EMA, so both hold the same EMA and parameters."""
    r0, _ = run_ddp(tmp_path, DDP_BALANCER, DDP_STEPS)  # checks that both ranks hold the same state and parameters
    assert r0["state"]["aggregator.steps"].item() == DDP_STEPS and r0["state"]["aggregator.grad_ema"].abs().sum() > 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"beta": 1.0}, "beta: must be a number in [0, 1), got 1.0"),
        ({"beta_sigma": -1.0}, "beta_sigma: must be a number >= 0"),
        ({"eps": 0.0}, "eps: must be a number > 0"),
        ({"shared_params": []}, "shared_params: DB-MTL needs the model's shared parameters"),
    ],
)
def test_bad_options_name_their_argument(options, message):
    options = {"shared_params": pair_model().shared_parameters(), **options}
    with pytest.raises(ValueError) as info:
        DualBalancing(list(TASKS), **options)
    assert str(info.value).startswith(message)
