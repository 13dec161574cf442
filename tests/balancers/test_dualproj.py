"""DualProj: the projection by hand, and the parameters of torchjd 0.18's DualProj after 6 steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtl_bench.balancers import BackwardContext, DualProj
from mtl_bench.balancers.dualproj import dualproj_weights
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_same_parameters,
    make_model,
    train_ours,
    train_torchjd,
)


def build(model, **options) -> DualProj:
    return DualProj(list(TASKS3), list(model.trunk.parameters()), **options)


def test_projection_by_hand():
    # g1 = (1, 0), g2 = (−3, 1): mean = (−1, 0.5) conflicts with g1 (g1·mean = −1 < 0). The projection onto
    # {x: x·g1 ≥ 0, x·g2 ≥ 0} is (0, 0.5) = v1 g1 + v2 g2 with v2 = 0.5, v1 = 1.5: only g1's bound is active.
    gram = np.array([[1.0, -3.0], [-3.0, 10.0]])
    weights, active = dualproj_weights(gram, np.array([0.5, 0.5]), 0.0, 0.0)
    assert weights.tolist() == pytest.approx([1.5, 0.5]) and active == 1
    weights, active = dualproj_weights(np.eye(2), np.array([0.5, 0.5]), 0.0, 0.0)  # no conflict: the mean
    assert weights.tolist() == [0.5, 0.5] and active == 0


def test_matches_torchjd():
    aggregation = pytest.importorskip("torchjd.aggregation")
    pytest.importorskip("quadprog")
    ours, reference = make_model(), make_model()
    history = train_ours(ours, build(ours), 6)
    train_torchjd(reference, aggregation.DualProj(), 6)
    assert_same_parameters(ours, reference)
    assert sum(m["dualproj/active"].item() for m in history) > 0  # the case has conflicts


def test_per_task_mode_with_scaler_matches_the_joint_step():
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    assert_per_task_is_the_joint_step(build, ["b", "c", "a"], ctx, scale=2.0**8)


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="^norm_eps: must be a number >= 0"):
        build(make_model(), norm_eps=-1.0)
