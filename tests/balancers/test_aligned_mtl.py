"""Aligned-MTL: equal singular values by hand, against torchjd 0.18 (LibMTL main's code needs torch.symeig)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtl_bench.balancers import AlignedMTL, BackwardContext
from mtl_bench.balancers.aligned_mtl import aligned_weights
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_same_parameters,
    batch,
    make_model,
    no_host_sync,
    shared_lr_groups,
    task_losses,
    train_ours,
    train_torchjd,
)

LR = 0.1


def build(model, tasks=TASKS3, **options) -> AlignedMTL:
    return AlignedMTL(list(tasks), list(model.trunk.parameters()), **options)


def test_aligned_gradients_have_equal_singular_values():
    """The aligned matrix Ĝ = BJ (rows: aligned gradients) has all singular values √σ_min."""
    rng = np.random.default_rng(0)
    jac = rng.normal(size=(3, 8)) * np.array([[1.0], [10.0], [0.1]])
    gram = jac @ jac.T
    weights, condition = aligned_weights(gram, "min")
    lam, vec = np.linalg.eigh(gram)
    balance = np.sqrt(lam.min()) * (vec / np.sqrt(lam)) @ vec.T
    singular = np.linalg.svd(balance @ jac, compute_uv=False)
    np.testing.assert_allclose(singular, np.sqrt(lam.min()), rtol=1e-8)
    np.testing.assert_allclose(weights @ jac, (balance @ jac).sum(0), rtol=1e-8)
    assert condition == pytest.approx(np.sqrt(lam.max() / lam.min()))
    # Orthogonal gradients of norms 1 and 3: aligned to norm 1 each, so α = (1, 1/3).
    assert aligned_weights(np.diag([1.0, 9.0]), "min")[0].tolist() == pytest.approx([1.0, 1 / 3])


def test_matches_torchjd():
    """torchjd's direction is ours divided by T: train ours with the trunk's learning rate divided by 3."""
    aggregation = pytest.importorskip("torchjd.aggregation")
    for mode in ("min", "median", "rmse"):
        ours, reference = make_model(), make_model()
        train_ours(ours, build(ours, scale_mode=mode), 5, opt=torch.optim.SGD(shared_lr_groups(ours, LR, 1 / 3), lr=LR))
        train_torchjd(reference, aggregation.AlignedMTL(scale_mode=mode), 5, lr=LR)
        assert_same_parameters(ours, reference)


def test_shared_rep_and_scaler():
    plain, scaled = make_model(), make_model()
    x, y = batch()
    out, losses = task_losses(plain, x, y)
    expected = build(plain, grad_source="shared_rep").backward(losses, out.shared)
    out, losses = task_losses(scaled, x, y)
    balancer = build(scaled, grad_source="shared_rep")
    with no_host_sync(host_solve_of=balancer):  # its eigendecomposition is its one, declared, host read
        metrics = balancer.backward(
            losses, out.shared, BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=8.0))
        )
    for p, q in zip(plain.parameters(), scaled.parameters()):
        torch.testing.assert_close(q.grad / 8, p.grad, rtol=1e-5, atol=1e-7)
    for key in expected:
        torch.testing.assert_close(metrics[key], expected[key], rtol=1e-5, atol=1e-6)


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="^scale_mode"):
        build(make_model(), scale_mode="max")
