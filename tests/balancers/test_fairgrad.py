"""FairGrad: the fairness condition by hand, the parameters of torchjd 0.18's FairGrad after 6 steps and of
LibMTL main's FairGrad after 4 (numbers taken from it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtl_bench.balancers import BackwardContext, FairGrad
from mtl_bench.balancers.fairgrad import fairgrad_weights
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_same_parameters,
    conflicting_gramians,
    make_model,
    train_ours,
    train_torchjd,
)


def build(model, **options) -> FairGrad:
    return FairGrad(list(TASKS3), list(model.trunk.parameters()), **options)


def test_fairness_condition_by_hand():
    # Orthogonal gradients, G = diag(4, 1): G w = w^(-1/α) gives w_i = G_ii^(-α/(α+1)).
    gram = np.diag([4.0, 1.0])
    for alpha in (1.0, 2.0):
        weights, cost = fairgrad_weights(gram, alpha, None)
        assert weights.tolist() == pytest.approx([4.0 ** (-alpha / (alpha + 1)), 1.0], rel=1e-6) and cost < 1e-12
    assert fairgrad_weights(gram, 0.0, None)[0].tolist() == [0.5, 0.5]  # α = 0: the uniform sum


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_exact_jacobian_solve_is_the_finite_difference_solve(alpha):
    """The references run scipy's least_squares with finite differences; we give it the residual's Jacobian."""
    from scipy.optimize import least_squares

    for gram in conflicting_gramians(4):
        start = np.full(gram.shape[0], 1.0 / gram.shape[0])
        reference = least_squares(lambda x: gram @ x - np.power(x, -1.0 / alpha), start, bounds=(0, np.inf)).x
        np.testing.assert_allclose(fairgrad_weights(gram, alpha, None)[0], reference, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("alpha", [0.5, 2.0])
def test_matches_torchjd(alpha):
    aggregation = pytest.importorskip("torchjd.aggregation")
    ours, reference = make_model(), make_model()
    train_ours(ours, build(ours, alpha=alpha, head_weights="ones"), 6)
    train_torchjd(reference, aggregation.FairGrad(alpha), 6)
    assert_same_parameters(ours, reference, rtol=1e-4, atol=1e-5)  # least squares on float32 G there, float64 here


# LibMTL main (github.com/median-research-group/LibMTL, commit 4336804847eaa5e0b924b743d76beec7ac3fdc97),
# LibMTL/weighting/FairGrad.py with that commit's abstract_weighting.py, on tests.helpers.balancer_kit's make_model()
# (the trunk as LibMTL's encoder) and batches, SGD lr 0.1, 4 steps of backward(losses, FairGrad_alpha=2.0).
FAIRGRAD_MAIN_PARAMS_AFTER_4 = {
    "trunk.0.weight": [
        -0.00153084111,
        0.368263811,
        -0.524373353,
        -0.368277729,
        -0.268417329,
        0.101365969,
        0.0531257465,
        0.397576839,
        -0.10414432,
        0.134423941,
        -0.0433919169,
        -0.181418076,
    ],
    "trunk.0.bias": [-0.552322984, -0.398620725, -0.292842299, -0.00474164775],
    "trunk.2.weight": [
        0.123054914,
        0.229779795,
        -0.35047552,
        -0.213659436,
        0.219900116,
        0.469462126,
        -0.13427186,
        0.410005152,
        -0.130686358,
        0.0613871068,
        0.366195917,
        -0.377544701,
        -0.301987618,
        -0.102963507,
        -0.135935292,
        0.403624803,
        -0.426400393,
        -0.17445831,
        -0.424643725,
        -0.449658781,
    ],
    "trunk.2.bias": [-0.1255631, 0.283871293, 0.170978814, 0.221693635, 0.0242840108],
    "heads.a.weight": [-0.215449303, 0.0290710609, -0.274298906, -0.386070013, -0.234438568],
    "heads.a.bias": [0.286939979],
    "heads.b.weight": [
        0.232116178,
        -0.173300937,
        0.0867616013,
        0.345452815,
        0.537084997,
        0.112695523,
        0.100315616,
        0.252245694,
        -0.155181348,
        0.180953041,
    ],
    "heads.b.bias": [-0.170498535, -0.182567611],
    "heads.c.weight": [-0.0692388341, 0.217314333, -0.00674868841, -0.188818693, 0.0674309954],
    "heads.c.bias": [-0.0603354312],
}


def test_matches_libmtl_main_reference_numbers():
    model = make_model()
    train_ours(model, build(model, alpha=2.0), 4)
    for name, p in model.named_parameters():
        expected = torch.tensor(FAIRGRAD_MAIN_PARAMS_AFTER_4[name])
        torch.testing.assert_close(p.detach().flatten(), expected, rtol=1e-5, atol=1e-6, msg=name)


def test_per_task_mode_with_scaler_matches_the_joint_step():
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    assert_per_task_is_the_joint_step(build, ["b", "a", "c"], ctx, scale=2.0**8)


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="^alpha: must be a number >= 0"):
        build(make_model(), alpha=-1.0)
    with pytest.raises(ValueError, match="^head_weights: 'alpha' is not one of weights, ones"):
        build(make_model(), head_weights="alpha")
