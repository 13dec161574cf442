"""PCD: the constrained direction by hand, infeasible constraints, the parameters of torchjd 0.18's PCD after 6
steps, resume and skipped steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtl_bench.balancers import PCD, BackwardContext
from mtl_bench.balancers.pcd import pcd_weights
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_resume_and_skip_keep_the_state,
    assert_same_parameters,
    make_model,
    train_ours,
    train_torchjd,
)


def build(model, **options) -> PCD:
    return PCD(list(TASKS3), list(model.trunk.parameters()), **options)


def test_direction_by_hand():
    # Unit scales, g1 = (1, 0), g2 = (−1, 1), τ = 0.5: g1 gives g2 progress −1 < τ‖g2‖² = 1, so the constraint is
    # active: d = g1 + μ g2 with g2·d = −1 + 2μ = 1, μ = 1, d = (0, 1), rescaled to ‖g1‖ = 1: w = (1, 1).
    jac = np.array([[1.0, 0.0], [-1.0, 1.0]])
    weights, feasible = pcd_weights(jac @ jac.T, np.ones(2), 0.5)
    assert weights.tolist() == pytest.approx([1.0, 1.0]) and feasible
    weights, _ = pcd_weights(jac @ jac.T, np.ones(2), 0.0)  # τ = 0: g1 itself would still hurt g2; μ = 1/2
    assert weights.tolist() == pytest.approx([1 / np.sqrt(0.5) * 1.0, 1 / np.sqrt(0.5) * 0.5])
    # Two anti-parallel secondary gradients cannot both progress: d follows g1 alone.
    jac = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    weights, feasible = pcd_weights(jac @ jac.T, np.ones(3), 0.1)
    assert weights.tolist() == [1.0, 0.0, 0.0] and not feasible


def test_primary_is_any_task():
    theta = torch.zeros(2, requires_grad=True)
    # Unit gradients (β = 0, ε = 0: scales 1/‖g_i‖ = 1), b primary: g_a·g_b = −0.6 < τ = 0.5, so
    # d = g_b + μ g_a with g_a·d = −0.6 + μ = 0.5: μ = 1.1, d = (0.34, 0.88), rescaled to ‖g_b‖ = 1.
    rows = {"a": torch.tensor([-0.6, 0.8]), "b": torch.tensor([1.0, 0.0])}
    bal = PCD(list(rows), [theta], primary="b", tau=0.5, beta=0.0, eps=0.0)
    metrics = bal.backward({t: (r * theta).sum() for t, r in rows.items()}, theta)
    d = np.array([0.34, 0.88])
    assert theta.grad.tolist() == pytest.approx((d / np.linalg.norm(d)).tolist(), rel=1e-6)
    assert metrics["pcd/feasible"].item() == 1.0


@pytest.mark.parametrize("tau", [0.02, 0.5])
def test_matches_torchjd(tau):
    aggregation = pytest.importorskip("torchjd.aggregation")
    ours, reference = make_model(), make_model()
    history = train_ours(ours, build(ours, tau=tau, beta=0.9), 6)
    train_torchjd(reference, aggregation.PCD(tau=tau, beta=0.9), 6)
    assert_same_parameters(ours, reference)
    assert sum(m["weight/b"].item() > 0 for m in history) >= 3  # constraints were active


def test_resume_continues_and_a_skipped_step_keeps_the_state():
    saved = assert_resume_and_skip_keep_the_state(lambda model: build(model, tau=0.5, beta=0.9))
    assert set(saved) == {"weighting.sq_norm_ema", "weighting.steps"} and saved["weighting.steps"].item() == 2


def test_per_task_mode_with_scaler_matches_the_joint_step():
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    assert_per_task_is_the_joint_step(lambda model: build(model, tau=0.5), ["c", "b", "a"], ctx, scale=2.0**8)


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match=r"^primary: 'z' is not one of a, b, c$"):
        build(make_model(), primary="z")
    with pytest.raises(ValueError, match=r"^tau: must be a number in \[0, 1\]"):
        build(make_model(), tau=2.0)
