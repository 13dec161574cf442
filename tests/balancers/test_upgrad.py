"""UPGrad: the dual-cone projection by hand, the QP solver against quadprog, and against torchjd 0.18."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from mtl_bench.balancers import BackwardContext, UPGrad
from mtl_bench.balancers.upgrad import upgrad_weights
from mtl_bench.gradient_engine.solvers import active_set_qp, dual_cone_weights, nonneg_qps
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_same_parameters,
    make_model,
    train_ours,
    train_torchjd,
)


def build(model, tasks=TASKS3, **options) -> UPGrad:
    return UPGrad(list(tasks), list(model.trunk.parameters()), **options)


def test_projection_by_hand():
    # g1 = (1, 0), g2 = (−1, 1). Projecting g1 onto {x: x·g1 ≥ 0, x·g2 ≥ 0}: g1·g2 < 0, so the projection is
    # g1 minus its part along g2 (the cone's face x·g2 = 0): (0.5, 0.5) = 1·g1 + 0.5·g2, so v = (1, 0.5).
    gram = np.array([[1.0, -1.0], [-1.0, 2.0]])
    assert dual_cone_weights(gram, np.array([1.0, 0.0])).tolist() == pytest.approx([1.0, 0.5])
    # Projecting g2: g2·g1 < 0 → (0, 1) = 1·g1 + 1·g2, v = (1, 1).
    assert dual_cone_weights(gram, np.array([0.0, 1.0])).tolist() == pytest.approx([1.0, 1.0])
    # No conflict: nothing moves.
    assert dual_cone_weights(np.array([[1.0, 0.2], [0.2, 1.0]]), np.array([0.5, 0.0])).tolist() == [0.5, 0.0]
    weights, active = upgrad_weights(gram, 0.0, 0.0)
    assert weights.tolist() == pytest.approx([1.0, 0.75]) and active == 2


def test_qp_solver_agrees_with_quadprog():
    qpsolvers = pytest.importorskip("qpsolvers")
    pytest.importorskip("quadprog")
    rng = np.random.default_rng(0)
    for t in (2, 3, 5, 10, 20):
        for _ in range(20):
            jac = rng.normal(size=(t, 4 if t > 4 else 7))
            gram = jac @ jac.T + 1e-4 * np.eye(t)
            u = rng.uniform(0, 1, size=t)
            expected = qpsolvers.solve_qp(gram, np.zeros(t), -np.eye(t), -u, solver="quadprog")
            np.testing.assert_allclose(dual_cone_weights(gram, u), expected, rtol=1e-7, atol=1e-9)


def test_projections_of_many_rows_are_those_of_each_row():
    rng = np.random.default_rng(1)
    jac = rng.normal(size=(6, 3))
    gram = jac @ jac.T + 1e-4 * np.eye(6)
    rows = rng.uniform(0, 1, size=(4, 6))
    together = dual_cone_weights(gram, rows)
    for k, u in enumerate(rows):
        np.testing.assert_allclose(together[k], dual_cone_weights(gram, u), rtol=1e-12, atol=1e-15)


def test_nnls_and_the_numpy_active_set_method_agree():
    """The compiled NNLS on the Cholesky factor meets the QP's optimality conditions (x ≥ 0, Gx + c ≥ 0,
    xᵀ(Gx + c) = 0) and gives the numpy active-set method's answer; that method takes a G whose Cholesky
    factorisation fails."""
    rng = np.random.default_rng(2)
    jac = rng.normal(size=(8, 3))
    gram = jac @ jac.T + 1e-4 * np.eye(8)  # nearly singular, as UPGrad's with more tasks than dimensions
    linears = rng.normal(size=(5, 8))
    for x, c in zip(nonneg_qps(gram, linears), linears):
        slack = gram @ x + c
        size = np.abs(gram).max() * np.abs(x).max() + np.abs(c).max()
        assert (x >= 0).all() and (slack >= -1e-9 * size).all() and abs(x @ slack) < 1e-9 * size * np.abs(x).sum()
        np.testing.assert_allclose(x, active_set_qp(gram, c), rtol=1e-7, atol=1e-10)
    singular = np.array([[1.0, 1.0], [1.0, 1.0]])
    assert nonneg_qps(singular, np.array([[-1.0, 0.0]])).tolist() == [[1.0, 0.0]]


def test_matches_torchjd():
    aggregation = pytest.importorskip("torchjd.aggregation")
    pytest.importorskip("quadprog")
    ours, reference = make_model(), make_model()
    history = train_ours(ours, build(ours), 6)
    train_torchjd(reference, aggregation.UPGrad(), 6)
    assert_same_parameters(ours, reference)
    assert sum(m["upgrad/active"].item() for m in history) > 0


def test_per_task_mode_with_scaler_matches_the_joint_step():
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    assert_per_task_is_the_joint_step(build, TASKS3, ctx, scale=2.0**8)


def test_bad_options_fail_clearly():
    model = make_model()
    with pytest.raises(ValueError, match="^reg_eps"):
        build(model, reg_eps=-1.0)
    assert "grad_source" not in inspect.signature(UPGrad).parameters  # shared_params only: no option for it
    with pytest.raises(TypeError, match="grad_source"):
        build(model, grad_source="shared_rep")
