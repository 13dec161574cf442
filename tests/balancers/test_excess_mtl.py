"""ExcessMTL: the excess risks and the weight update by hand, the parameters of torchjd 0.18's ExcessMTL after 6
steps and of LibMTL main's ExcessMTL after 5 (numbers taken from it), resume and skipped steps."""

from __future__ import annotations

import math

import pytest
import torch

from mtl_bench.balancers import BackwardContext, ExcessMTL
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_resume_and_skip_keep_the_state,
    assert_same_parameters,
    make_model,
    run_ddp,
    train_ours,
    train_torchjd,
)


def build(model, **options) -> ExcessMTL:
    return ExcessMTL(list(TASKS3), list(model.trunk.parameters()), **options)


def test_two_steps_by_hand():
    # θ ∈ R², L_a = (1, 0)·θ·c_a, L_b = (0, 2)·θ: gradients g_a = (c_a, 0), g_b = (0, 2).
    theta = torch.zeros(2, requires_grad=True)
    bal = ExcessMTL(["a", "b"], [theta], robust_step_size=0.5, head_weights="ones")

    def step(c_a: float) -> dict:
        theta.grad = None
        losses = {"a": (torch.tensor([c_a, 0.0]) * theta).sum(), "b": (torch.tensor([0.0, 2.0]) * theta).sum()}
        return bal.backward(losses, theta)

    step(1.0)  # warm-up: S = (1, 4); e = (1/√1, 4/√4) = (1, 2) is the baseline; weights stay 1
    assert bal.aggregator.baseline.tolist() == pytest.approx([1.0, 2.0], rel=1e-6)
    assert bal.aggregator.weights.tolist() == [1.0, 1.0]
    assert theta.grad.tolist() == [1.0, 2.0]
    metrics = step(3.0)  # S = (10, 8); e = (9/√10, 4/√8); ratio = e / (1, 2); w = 2·softmax(0.5·ratio)
    ratio = [9 / math.sqrt(10), 4 / math.sqrt(8) / 2]
    z = [math.exp(0.5 * r) for r in ratio]
    w = [2 * v / sum(z) for v in z]
    assert [metrics["weight/a"].item(), metrics["weight/b"].item()] == pytest.approx(w, rel=1e-6)
    assert [metrics["excess_mtl/excess/a"].item(), metrics["excess_mtl/excess/b"].item()] == pytest.approx(ratio)
    assert theta.grad.tolist() == pytest.approx([3 * w[0], 2 * w[1]], rel=1e-6)


@pytest.mark.parametrize("warmup_steps", [1, 3])
def test_matches_torchjd(warmup_steps):
    aggregation = pytest.importorskip("torchjd.aggregation")
    ours, reference = make_model(), make_model()
    options = dict(robust_step_size=0.5, warmup_steps=warmup_steps, total="one", head_weights="ones")
    train_ours(ours, build(ours, **options), 6)
    train_torchjd(reference, aggregation.ExcessMTL(0.5, n_warmup_steps=warmup_steps), 6)
    assert_same_parameters(ours, reference)


# LibMTL main (github.com/median-research-group/LibMTL, commit 4336804847eaa5e0b924b743d76beec7ac3fdc97),
# LibMTL/weighting/ExcessMTL.py with that commit's abstract_weighting.py, on tests.helpers.balancer_kit's
# make_model() (the trunk as LibMTL's encoder) and batches, SGD lr 0.1, 5 steps of
# backward(losses, robust_step_size=0.5).
EXCESS_MTL_MAIN_PARAMS_AFTER_5 = {
    "trunk.0.weight": [
        0.0258122832,
        0.141498953,
        -0.517495751,
        -0.347535521,
        -0.258567601,
        0.0848016366,
        0.105066933,
        0.327072173,
        -0.180227488,
        0.138617381,
        -0.225313991,
        -0.154157668,
    ],
    "trunk.0.bias": [-0.702311039, -0.409817755, -0.38284269, -0.150509983],
    "trunk.2.weight": [
        0.082363978,
        0.248437941,
        -0.344956815,
        -0.248029932,
        0.248702496,
        0.388189733,
        -0.114777088,
        0.426838785,
        -0.0854111835,
        -0.0559902266,
        0.438948512,
        -0.393854886,
        -0.381529987,
        -0.126963735,
        -0.157939076,
        0.35637033,
        -0.481306106,
        -0.26763612,
        -0.352120906,
        -0.523986459,
    ],
    "trunk.2.bias": [-0.0702638254, 0.339154512, 0.332704574, 0.401007384, 0.270701408],
    "heads.a.weight": [-0.170812041, 0.0315646343, -0.432756841, -0.371482819, -0.25270012],
    "heads.a.bias": [0.132746786],
    "heads.b.weight": [
        0.157809347,
        -0.126333594,
        0.238971367,
        0.406975985,
        0.625245214,
        0.0289839115,
        0.0962070152,
        0.225676522,
        0.0425530933,
        0.244697794,
    ],
    "heads.b.bias": [0.0967093781, 0.0723749995],
    "heads.c.weight": [-0.180534184, 0.197701931, 0.133215129, -0.292434692, 0.106624603],
    "heads.c.bias": [0.128313228],
}


def test_matches_libmtl_main_reference_numbers():
    model = make_model()
    train_ours(model, build(model, robust_step_size=0.5), 5)
    for name, p in model.named_parameters():
        expected = torch.tensor(EXCESS_MTL_MAIN_PARAMS_AFTER_5[name])
        torch.testing.assert_close(p.detach().flatten(), expected, rtol=1e-5, atol=1e-6, msg=name)


def test_resume_continues_and_a_skipped_step_keeps_the_state():
    saved = assert_resume_and_skip_keep_the_state(lambda model: build(model, warmup_steps=2), first=3, then=2)
    assert saved["aggregator.steps"].item() == 3
    assert {"aggregator.weights", "aggregator.baseline", "aggregator.sq_grad_sum_0"} <= set(saved)


def test_per_task_mode_with_scaler_matches_the_joint_step():
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    assert_per_task_is_the_joint_step(build, ["b", "c", "a"], ctx, scale=2.0**8)


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="^warmup_steps: must be an integer >= 1"):
        build(make_model(), warmup_steps=0)
    with pytest.raises(ValueError, match="^total: 'two' is not one of tasks, one"):
        build(make_model(), total="two")


def make_for_ranks(names, model):
    return ExcessMTL(names, list(model.trunk.parameters()), robust_step_size=0.5)


@pytest.mark.slow  # two gloo processes, each starting torch
def test_ddp_ranks_hold_the_same_state(tmp_path):
    """Each rank sees its own half batch; the squared gradients are averaged over the ranks, so the
    squared-gradient sums, weights and parameters agree bit for bit."""
    r0, _ = run_ddp(tmp_path, make_for_ranks, steps=3)
    assert r0["state"]["aggregator.steps"].item() == 3 and r0["state"]["aggregator.sq_grad_sum_0"].abs().sum() > 0
