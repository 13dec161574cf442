"""CAGrad: the dual's optimality by hand, against LibMTL 1.1.5 at T = 3 (the only T its reshape allows) and
against torchjd 0.18 at T = 4 (another solver: to its tolerance)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtl_bench.balancers import BackwardContext, CAGrad
from mtl_bench.balancers.cagrad import cagrad_weights
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_same_parameters,
    batch,
    conflicting_gramians,
    libmtl_weighting,
    make_model,
    no_host_sync,
    shared_lr_groups,
    task_losses,
    train_libmtl,
    train_ours,
)

LR = 0.1


def build(model, tasks=TASKS3, **options) -> CAGrad:
    return CAGrad(list(tasks), list(model.trunk.parameters()), **options)


def test_two_tasks_by_hand():
    # Orthogonal g1 = (1, 0), g2 = (0, 1), c = 0.5: by symmetry w = (½, ½), g_w = g0 = (½, ½), λ = c, so
    # d = T·(1 + c)·g0/(1 + c²) and every weight is 2·1.5·0.5/1.25 = 1.2.
    weights, lam = cagrad_weights(np.eye(2), 0.5, 1)
    assert lam == pytest.approx(0.5, rel=1e-4) and weights.tolist() == pytest.approx([1.2, 1.2], rel=1e-4)
    # c = 0 is gradient descent on the sum.
    assert cagrad_weights(np.array([[1.0, -0.3], [-0.3, 2.0]]), 0.0, 0)[0].tolist() == pytest.approx([1.0, 1.0])


def test_dual_solution_is_optimal_for_four_tasks():
    rng = np.random.default_rng(1)
    jac = rng.normal(size=(4, 9))
    gram = jac @ jac.T
    weights, lam = cagrad_weights(gram, 0.5, 0)
    w = (weights / 4 - 0.25) / lam
    radius = 0.5 * np.sqrt(gram.mean() + 1e-8)

    def value(x):
        return x @ gram @ np.full(4, 0.25) + radius * np.sqrt(x @ gram @ x + 1e-8)

    for _ in range(200):
        other = rng.dirichlet(np.ones(4))
        assert value(w) <= value(other) + 1e-6


def test_exact_gradient_solve_is_the_reference_finite_difference_solve():
    """The authors' code runs SLSQP with scipy's finite differences; we give it the exact gradient."""
    from scipy.optimize import minimize

    for gram in conflicting_gramians(3):
        t = gram.shape[0]
        start = np.ones(t) / t
        radius = 0.5 * np.sqrt(gram.mean() + 1e-8) + 1e-8
        reference = minimize(
            lambda x: x @ gram @ start + radius * np.sqrt(x @ gram @ x + 1e-8),
            start,
            bounds=[(0, 1)] * t,
            constraints={"type": "eq", "fun": lambda x: 1 - x.sum()},
        ).x
        lam = radius / (np.sqrt(reference @ gram @ reference) + 1e-8)
        weights, _ = cagrad_weights(gram, 0.5, 0)
        np.testing.assert_allclose(weights, t * (start + lam * reference), rtol=1e-5, atol=1e-7)


def test_matches_libmtl_with_three_tasks():
    """LibMTL's direction is ours divided by T: train ours with the trunk's learning rate divided by 3."""
    ours, reference = make_model(), make_model()
    opt = torch.optim.SGD(shared_lr_groups(ours, LR, 1 / 3), lr=LR)
    train_ours(ours, build(ours), 5, opt=opt)
    train_libmtl(reference, libmtl_weighting("CAGrad", reference, TASKS3), 5, lr=LR, calpha=0.5, rescale=1)
    assert_same_parameters(ours, reference)


def test_libmtl_fails_where_we_run_four_tasks():
    tasks = ("a", "b", "c", "d")
    model = make_model(tasks)
    metrics = train_ours(model, build(model, tasks), 2, tasks)
    assert all(metrics[-1][f"weight/{t}"].isfinite() for t in tasks)
    reference = make_model(tasks)
    with pytest.raises(ValueError):
        train_libmtl(reference, libmtl_weighting("CAGrad", reference, tasks), 1, tasks, calpha=0.5, rescale=1)


def test_weights_agree_with_torchjd_for_four_tasks():
    aggregation = pytest.importorskip("torchjd.aggregation")
    pytest.importorskip("cvxpy")
    rng = np.random.default_rng(2)
    jac = rng.normal(size=(4, 12))
    gram = jac @ jac.T
    expected = aggregation.CAGrad(c=0.5).gramian_weighting(torch.tensor(gram)).numpy()
    ours, _ = cagrad_weights(gram, 0.5, 0)
    np.testing.assert_allclose(ours / 4, expected, rtol=2e-3)


def test_scaler_and_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    plain, scaled = make_model(), make_model()
    x, y = batch()
    out, losses = task_losses(plain, x, y)
    expected = build(plain).backward(losses, out.shared)
    out, losses = task_losses(scaled, x, y)
    bal = build(scaled)
    with no_host_sync(host_solve_of=bal):  # SLSQP's copy of G is the one sync
        metrics = bal.backward(losses, out.shared, BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=4.0)))
    for p, q in zip(plain.parameters(), scaled.parameters()):
        torch.testing.assert_close(q.grad / 4, p.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(metrics["cagrad/lambda"], expected["cagrad/lambda"], rtol=1e-4, atol=0)


def test_bad_options_fail_clearly():
    model = make_model()
    with pytest.raises(ValueError, match="^c:"):
        build(model, c=-0.1)
    with pytest.raises(ValueError, match="^rescale"):
        build(model, rescale=3)
