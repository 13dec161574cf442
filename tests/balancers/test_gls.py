"""GeometricLoss (GLS): the weights by hand, and the parameters of LibMTL 1.1.5's GLS and torchjd 0.18's
GeometricMean after 6 steps."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import GeometricLoss
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_same_parameters,
    libmtl_weighting,
    make_model,
    train_libmtl,
    train_ours,
    train_scalarizer,
)


def test_weights_by_hand():
    shared = torch.zeros(1, requires_grad=True)
    losses = {"a": (2.0 + shared).sum(), "b": (8.0 + shared).sum()}  # geometric mean 4
    metrics = GeometricLoss(["a", "b"]).backward(losses, shared)
    assert [metrics["weight/a"].item(), metrics["weight/b"].item()] == pytest.approx([4 / (2 * 2), 4 / (2 * 8)])


def test_matches_libmtl_gls():
    ours, reference = make_model(), make_model()
    train_ours(ours, GeometricLoss(list(TASKS3)), 6)
    train_libmtl(reference, libmtl_weighting("GLS", reference, TASKS3), 6)
    assert_same_parameters(ours, reference)


def test_matches_torchjd_geometric_mean():
    scalarization = pytest.importorskip("torchjd.scalarization")
    ours, reference = make_model(), make_model()
    train_ours(ours, GeometricLoss(list(TASKS3)), 6)
    train_scalarizer(reference, scalarization.GeometricMean(), 6)
    assert_same_parameters(ours, reference)
