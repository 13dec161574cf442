"""IMTL: the equal-projection property, against LibMTL 1.1.5 (IMTL-H, scales trained by the same SGD) and
torchjd 0.18 (IMTL-G), IMTL-L by hand, resume and skipped steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtl_bench.balancers import IMTL, BackwardContext
from mtl_bench.balancers.imtl import imtl_g_weights
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_resume_and_skip_keep_the_state,
    assert_same_parameters,
    batch,
    libmtl_weighting,
    make_model,
    task_losses,
    train_libmtl,
    train_ours,
    train_torchjd,
)

LR = 0.1


def build(model, tasks=TASKS3, **options) -> IMTL:
    return IMTL(list(tasks), list(model.trunk.parameters()), **options)


def test_equal_projections_by_hand():
    rng = np.random.default_rng(0)
    jac = rng.normal(size=(3, 6))
    alpha = imtl_g_weights(jac @ jac.T)
    g = alpha @ jac
    projections = jac @ g / np.linalg.norm(jac, axis=1)
    assert alpha.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(projections, projections[0], rtol=1e-10)
    # g1 = (1, 0), g2 = (0, 2): α ∝ G⁻¹n = (1, 1/2) → (2/3, 1/3); g = (2/3, 2/3) projects 2/3 on both.
    assert imtl_g_weights(np.diag([1.0, 4.0])).tolist() == pytest.approx([2 / 3, 1 / 3])


def test_hybrid_matches_libmtl():
    ours, reference = make_model(), make_model()
    train_ours(ours, bal := build(ours, scale_optimizer="sgd", scale_lr=LR), 5, lr=LR)
    weighting = libmtl_weighting("IMTL", reference, TASKS3)
    train_libmtl(reference, weighting, 5, lr=LR, params=lambda: list(reference.parameters()) + [weighting.loss_scale])
    assert_same_parameters(ours, reference)
    torch.testing.assert_close(bal.weighting.loss_scale, weighting.loss_scale.detach(), rtol=1e-5, atol=1e-6)
    assert not torch.equal(bal.weighting.loss_scale, torch.zeros(3))


def test_gradient_mode_matches_torchjd():
    aggregation = pytest.importorskip("torchjd.aggregation")
    ours, reference = make_model(), make_model()
    train_ours(ours, build(ours, mode="gradient"), 5, lr=LR)
    train_torchjd(reference, aggregation.IMTLG(), 5, lr=LR)
    assert_same_parameters(ours, reference)


def test_loss_mode_trains_the_scaled_losses():
    """IMTL-L: the step is that of Σ e^{s_i} L_i; s moves by −lr(e^s L − 1)."""
    model, (x, y) = make_model(), batch()
    bal = build(model, mode="loss", scale_optimizer="sgd", scale_lr=0.5)
    bal.weighting.loss_scale.copy_(torch.tensor([0.5, -1.0, 0.2]))
    out, losses = task_losses(model, x, y)
    metrics = bal.backward(losses, out.shared)
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out, losses = task_losses(model, x, y)
    s = torch.tensor([0.5, -1.0, 0.2])
    sum(s[i].exp() * losses[t] for i, t in enumerate(TASKS3)).backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    L = torch.stack([losses[t].detach() for t in TASKS3])
    torch.testing.assert_close(bal.weighting.loss_scale, s - 0.5 * (s.exp() * L - 1))
    assert metrics["imtl/loss_scale/b"].item() == pytest.approx(-1.0)


def test_resume_and_skipped_steps():
    saved = assert_resume_and_skip_keep_the_state(lambda model: build(model, scale_lr=0.05))
    assert {"weighting.loss_scale", "weighting.exp_avg", "weighting.exp_avg_sq", "weighting.opt_step"} <= set(saved)


def test_shared_rep_and_per_task_mode():
    model, (x, y) = make_model(), batch()
    out, losses = task_losses(model, x, y)
    metrics = build(model, grad_source="shared_rep").backward(losses, out.shared)
    assert metrics["weight/a"].isfinite()
    assert_per_task_is_the_joint_step(build, TASKS3, BackwardContext())


def test_bad_options_fail_clearly():
    model = make_model()
    with pytest.raises(ValueError, match="^mode"):
        build(model, mode="imtl")
    with pytest.raises(ValueError, match="^scale_lr"):
        build(model, scale_lr=0)
    with pytest.raises(ValueError, match="^scale_optimizer"):
        build(model, scale_optimizer="rmsprop")
