"""MGDA: the min-norm point by hand, against LibMTL 1.1.5 (every normalisation) and torchjd 0.18, MGDA-UB."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtl_bench.balancers import MGDA, BackwardContext
from mtl_bench.gradient_engine.solvers import min_norm_simplex
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_same_parameters,
    batch,
    libmtl_weighting,
    make_model,
    task_losses,
    train_libmtl,
    train_ours,
    train_torchjd,
)


def build(model, tasks=TASKS3, **options) -> MGDA:
    return MGDA(list(tasks), list(model.trunk.parameters()), **options)


def test_min_norm_point_by_hand():
    # g1 = (1, 0), g2 = (0, 2): min ‖γ g1 + (1−γ) g2‖² at γ = 4/5, the point (0.8, 0.4), norm² 0.8.
    alpha = min_norm_simplex(np.array([[1.0, 0.0], [0.0, 4.0]]))
    assert alpha.tolist() == pytest.approx([0.8, 0.2])
    # Three gradients whose hull contains 0: (1,0), (−1,0), (0,1) → α = (½, ½, 0) and norm 0.
    alpha = min_norm_simplex(np.array([[1.0, -1.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    assert alpha.tolist() == pytest.approx([0.5, 0.5, 0.0], abs=1e-6)
    # One gradient dominated: g1·g2 ≥ ‖g1‖² picks g1 (the reference's 0.999).
    assert min_norm_simplex(np.array([[1.0, 1.0], [1.0, 4.0]])).tolist() == pytest.approx([0.999, 0.001])


def test_direction_on_a_linear_model():
    theta = torch.nn.Parameter(torch.zeros(2))
    shared = theta * 1.0
    losses = {"a": shared @ torch.tensor([1.0, 0.0]), "b": shared @ torch.tensor([0.0, 2.0])}
    metrics = MGDA(["a", "b"], [theta]).backward(losses, shared)
    torch.testing.assert_close(theta.grad, torch.tensor([0.8, 0.4]))
    assert metrics["mgda/min_norm"].item() == pytest.approx(0.8**0.5)
    assert [metrics["weight/a"].item(), metrics["weight/b"].item()] == pytest.approx([0.8, 0.2])


@pytest.mark.parametrize("normalization", ["none", "l2", "loss", "loss+"])
def test_matches_libmtl(normalization: str):
    ours, reference = make_model(), make_model()
    train_ours(ours, build(ours, normalization=normalization), 5)
    train_libmtl(reference, libmtl_weighting("MGDA", reference, TASKS3), 5, mgda_gn=normalization)
    assert_same_parameters(ours, reference)


def test_matches_torchjd_with_two_tasks():
    aggregation = pytest.importorskip("torchjd.aggregation")
    tasks = ("b", "d")
    ours, reference = make_model(tasks), make_model(tasks)
    history = train_ours(ours, build(ours, tasks), 5, tasks)
    train_torchjd(reference, aggregation.MGDA(), 5, tasks)
    assert_same_parameters(ours, reference)
    assert all(0.001 < m["weight/b"].item() < 0.999 for m in history)  # inside the segment: both are exact


def test_shared_rep_is_mgda_ub():
    """The solve on the gradients at the representation; that combination goes back through the trunk."""
    model, (x, y) = make_model(), batch()
    out, losses = task_losses(model, x, y)
    metrics = build(model, grad_source="shared_rep", normalization="l2").backward(losses, out.shared)
    got = [p.grad.clone() for p in model.trunk.parameters()]

    model.zero_grad()
    out, losses = task_losses(model, x, y)
    z = torch.stack([torch.autograd.grad(losses[t], out.shared, retain_graph=True)[0].flatten() for t in TASKS3])
    norms = z.norm(dim=1)
    alpha = torch.tensor(min_norm_simplex(((z / norms[:, None]) @ (z / norms[:, None]).T).double().numpy()))
    weights = alpha.float() / norms
    out.shared.backward((weights @ z).view_as(out.shared))
    for g, p in zip(got, model.trunk.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert [metrics[f"weight/{t}"].item() for t in TASKS3] == pytest.approx(weights.tolist(), rel=1e-5)


def test_per_task_mode_and_scaler_match_the_plain_step():
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**12))
    assert_per_task_is_the_joint_step(
        lambda model: build(model, normalization="loss+"), ("b", "c", "a"), ctx, scale=2.0**12, step=False
    )


def test_bad_options_fail_clearly():
    model = make_model()
    with pytest.raises(ValueError, match="^normalization"):
        build(model, normalization="norm")
    with pytest.raises(ValueError, match="^max_iter"):
        build(model, max_iter=0)
