"""ConFIG: equal cosines by hand, and the parameters of torchjd 0.18's ConFIG after 6 steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtl_bench.balancers import BackwardContext, ConFIG
from mtl_bench.balancers.con_fig import config_weights
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_same_parameters,
    make_model,
    train_ours,
    train_torchjd,
)


def build(model) -> ConFIG:
    return ConFIG(list(TASKS3), list(model.trunk.parameters()))


def test_direction_by_hand():
    # g1 = (2, 0), g2 = (0, 1): the direction of equal cosine is (1, 1)/√2; Σ g_i·û = (2 + 1)/√2, so
    # d = 1.5·(1, 1) = 0.75·g1 + 1.5·g2.
    jac = np.array([[2.0, 0.0], [0.0, 1.0]])
    weights, cosine = config_weights(jac @ jac.T)
    assert weights.tolist() == pytest.approx([0.75, 1.5]) and cosine == pytest.approx(1.0)
    # Three independent gradients, two conflicting: d has the same (positive) cosine with each.
    jac = np.array([[1.0, 0.2, 0.0], [-0.5, 1.0, 0.3], [0.3, -1.0, 0.8]])
    weights, _ = config_weights(jac @ jac.T)
    d = weights @ jac
    cosines = jac @ d / np.linalg.norm(jac, axis=1) / np.linalg.norm(d)
    assert np.ptp(cosines) < 1e-9 and cosines[0] > 0


def test_matches_torchjd():
    aggregation = pytest.importorskip("torchjd.aggregation")
    ours, reference = make_model(), make_model()
    train_ours(ours, build(ours), 6)
    train_torchjd(reference, aggregation.ConFIG(), 6)
    assert_same_parameters(ours, reference, rtol=1e-4, atol=1e-5)  # T×P float32 pinv there, T×T float64 here


def test_per_task_mode_with_scaler_matches_the_joint_step():
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    assert_per_task_is_the_joint_step(build, ["c", "a", "b"], ctx, scale=2.0**8)
