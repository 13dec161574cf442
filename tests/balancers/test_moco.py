"""MoCo: one step by hand, the parameters of LibMTL main's MoCo after 5 steps (numbers taken from it), AMP,
per-task mode, resume, skipped steps and DDP."""

from __future__ import annotations

import math

import pytest
import torch

from mtl_bench.balancers import BackwardContext, MoCo
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_resume_and_skip_keep_the_state,
    batch,
    make_model,
    run_ddp,
    task_losses,
    train_ours,
)


def build(model, **options) -> MoCo:
    return MoCo(list(TASKS3), list(model.trunk.parameters()), **options)


def test_first_step_by_hand():
    # θ ∈ R², L_a = 2 + (3, 4)·θ, L_b = 1 + (0, 1)·θ at θ = 0: ĝ_a = (3, 4)/5·2 = (1.2, 1.6), ĝ_b = (0, 1).
    # Step 1: β_1 = β = 0.5, so y = 0.5 ĝ; λ = softmax(λ_0 − γ (Y Yᵀ) λ_0) with λ_0 = (1/2, 1/2); d = Yᵀλ.
    theta = torch.zeros(2, requires_grad=True)
    bal = MoCo(["a", "b"], [theta], gamma=0.1)
    losses = {"a": 2 + (torch.tensor([3.0, 4.0]) * theta).sum(), "b": 1 + (torch.tensor([0.0, 1.0]) * theta).sum()}
    metrics = bal.backward(losses, theta)
    y = torch.tensor([[0.6, 0.8], [0.0, 0.5]])
    step = (y @ y.T) @ torch.tensor([0.5, 0.5])
    lam = torch.softmax(torch.tensor([0.5, 0.5]) - 0.1 * step, dim=0)
    torch.testing.assert_close(torch.stack([metrics["weight/a"], metrics["weight/b"]]), lam)
    torch.testing.assert_close(theta.grad, lam @ y)
    assert math.isclose(bal.aggregator.tracked_0[1, 1].item(), 0.5, rel_tol=1e-6)


# LibMTL main (github.com/median-research-group/LibMTL, commit 4336804847eaa5e0b924b743d76beec7ac3fdc97),
# LibMTL/weighting/MoCo.py with that commit's abstract_weighting.py, on tests.helpers.balancer_kit's make_model()
# (the trunk as LibMTL's encoder) and batches, SGD lr 0.1, 5 steps of backward(losses, MoCo_beta=0.5,
# MoCo_beta_sigma=0.5, MoCo_gamma=0.1, MoCo_gamma_sigma=0.5, MoCo_rho=0.01).
MOCO_MAIN_PARAMS_AFTER_5 = {
    "trunk.0.weight": [
        0.102355875,
        0.236642823,
        -0.612518907,
        -0.313250035,
        -0.263952911,
        0.0492659733,
        0.194393381,
        0.369232535,
        -0.266316086,
        0.212792426,
        -0.0966905504,
        -0.272035927,
    ],
    "trunk.0.bias": [-0.592023969, -0.420407593, -0.357871741, -0.0986476019],
    "trunk.2.weight": [
        0.0281517114,
        0.307875633,
        -0.382084727,
        -0.255701989,
        0.274231941,
        0.35614568,
        -0.109676212,
        0.43544966,
        -0.122418791,
        -0.0105428761,
        0.381560355,
        -0.393668354,
        -0.395576924,
        -0.0513052344,
        -0.170040399,
        0.35537836,
        -0.556359053,
        -0.151746839,
        -0.402058721,
        -0.5512923,
    ],
    "trunk.2.bias": [-0.105289511, 0.341266245, 0.25233674, 0.304570466, 0.190407425],
    "heads.a.weight": [-0.190201312, 0.0486713685, -0.405871481, -0.361851484, -0.23913753],
    "heads.a.bias": [0.199232489],
    "heads.b.weight": [
        0.121029884,
        -0.125530154,
        0.184219107,
        0.400185138,
        0.559378386,
        0.0378960148,
        0.10843993,
        0.275300264,
        0.0283226538,
        0.314035445,
    ],
    "heads.b.bias": [0.0675696209, 0.114601292],
    "heads.c.weight": [-0.144505844, 0.187394395, 0.0938851237, -0.317379445, 0.0795463845],
    "heads.c.bias": [0.0145548526],
}


def test_matches_libmtl_main_reference_numbers():
    model = make_model()
    train_ours(model, build(model, rho=0.01), 5)
    for name, p in model.named_parameters():
        expected = torch.tensor(MOCO_MAIN_PARAMS_AFTER_5[name])
        torch.testing.assert_close(p.detach().flatten(), expected, rtol=1e-5, atol=1e-6, msg=name)


def test_scaler_gives_the_fp32_parameters():
    ours, expected = make_model(), make_model()
    train_ours(expected, build(expected), 3)
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10))
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    bal = build(ours)
    for step in range(3):
        x, y = batch(seed=step)
        opt.zero_grad()
        out, losses = task_losses(ours, x, y)
        bal.backward(losses, out.shared, ctx)
        ctx.scaler.step(opt)
        ctx.scaler.update()
        bal.step()
    for p, q in zip(ours.parameters(), expected.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_resume_continues_and_a_skipped_step_keeps_the_state():
    saved = assert_resume_and_skip_keep_the_state(build)
    assert {"aggregator.lambdas", "aggregator.steps", "aggregator.tracked_0"} <= set(saved)
    assert saved["aggregator.steps"].item() == 2


def test_per_task_mode_with_scaler_matches_the_joint_step():
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    assert_per_task_is_the_joint_step(build, ["b", "c", "a"], ctx, scale=2.0**8)


def make_for_ranks(names, model):
    return MoCo(names, list(model.trunk.parameters()))


@pytest.mark.slow  # two gloo processes, each starting torch
def test_ddp_ranks_hold_the_same_state(tmp_path):
    r0, _ = run_ddp(tmp_path, make_for_ranks, steps=3)
    assert r0["state"]["aggregator.steps"].item() == 3


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="^gamma: must be a number > 0"):
        build(make_model(), gamma=0.0)
    with pytest.raises(ValueError, match="^rho: must be a number >= 0"):
        build(make_model(), rho=-1.0)
