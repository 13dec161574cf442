"""Nash-MTL: the bargaining condition Gα = 1/α, against the authors' code (numbers below, and their solve run
through cvxpy) and torchjd 0.18, state across steps (warm start, update_weights_every), resume, skipped steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ecos")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

from mtl_bench.balancers import BackwardContext, NashMTL  # noqa: E402
from mtl_bench.balancers.nash_mtl import NashSolver  # noqa: E402
from tests.helpers.balancer_kit import (  # noqa: E402
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_resume_and_skip_keep_the_state,
    assert_same_parameters,
    make_model,
    train_ours,
    train_torchjd,
)

# AvivNavon/nash-mtl at cce18403ef5557a6b30f4ba43b896117107d6902, methods/weight_methods.py NashMTL(n_tasks=3,
# max_norm=1.0), on make_model() with SGD lr 0.1 and batches batch(seed=step), steps 0-3: α per step and two
# parameters after the 4 steps (the heads trained on Σ α_i L_i, the trunk's update clipped to norm 1).
AUTHORS_ALPHA = [[2.6309917758884724, 0.49212930748059064, 2.146109960426134]] * 3 + [
    [1.3404053137326555, 0.811984043187253, 5.7096864367615945]
]
AUTHORS_TRUNK0_WEIGHT = [
    [0.008079352788627148, 0.3267533481121063, -0.5012377500534058],
    [-0.3910234272480011, -0.24079546332359314, 0.13412337005138397],
    [0.040128085762262344, 0.4175960123538971, -0.08604202419519424],
    [0.13240976631641388, -0.08394885808229446, -0.12570667266845703],
]
AUTHORS_HEAD_B_WEIGHT = [
    [0.2433210015296936, -0.1794532835483551, 0.06939530372619629, 0.3239147365093231, 0.5179555416107178],
    [0.12566855549812317, 0.0938023030757904, 0.2489919811487198, -0.12832553684711456, 0.17854785919189453],
]


def build(model, tasks=TASKS3, **options) -> NashMTL:
    return NashMTL(list(tasks), list(model.trunk.parameters()), **options)


def test_solution_is_the_bargaining_point():
    rng = np.random.default_rng(0)
    jac = rng.normal(size=(3, 7))
    gram = jac @ jac.T
    norm = np.linalg.norm(gram)
    alpha = NashSolver(3, 50, "ECOS")(gram / norm, norm, np.ones(3))
    np.testing.assert_allclose(gram @ alpha, 1 / alpha, rtol=2e-3)  # α_i·n·(Ĝα)_i = α_i·(Gα)_i = 1


class AuthorsSolve:
    """AvivNavon/nash-mtl at cce1840, methods/weight_methods.py NashMTL: `_init_optim_problem`, `_stop_criteria`
    and `solve_optimization` as written there (cvxpy, ECOS), on a given normalised Gramian and start."""

    def __init__(self, n_tasks, normalization_factor, start):
        cp = pytest.importorskip("cvxpy")
        self.cp, self.n_tasks, self.optim_niter = cp, n_tasks, 20
        self.normalization_factor, self.prvs_alpha = np.array([normalization_factor]), start
        self.init_gtg = np.eye(n_tasks)
        self.alpha_param = cp.Variable(shape=(n_tasks,), nonneg=True)
        self.prvs_alpha_param = cp.Parameter(shape=(n_tasks,), value=self.prvs_alpha)
        self.G_param = cp.Parameter(shape=(n_tasks, n_tasks), value=self.init_gtg)
        self.normalization_factor_param = cp.Parameter(shape=(1,), value=np.array([1.0]))
        G_prvs_alpha = self.G_param @ self.prvs_alpha_param
        prvs_phi_tag = 1 / self.prvs_alpha_param + (1 / G_prvs_alpha) @ self.G_param
        phi_alpha = prvs_phi_tag @ (self.alpha_param - self.prvs_alpha_param)
        G_alpha = self.G_param @ self.alpha_param
        constraint = [
            -cp.log(self.alpha_param[i] * self.normalization_factor_param) - cp.log(G_alpha[i]) <= 0
            for i in range(n_tasks)
        ]
        self.prob = cp.Problem(cp.Minimize(cp.sum(G_alpha) + phi_alpha / self.normalization_factor_param), constraint)

    def _stop_criteria(self, gtg, alpha_t):
        return (
            (self.alpha_param.value is None)
            or (np.linalg.norm(gtg @ alpha_t - 1 / (alpha_t + 1e-10)) < 1e-3)
            or (np.linalg.norm(self.alpha_param.value - self.prvs_alpha_param.value) < 1e-6)
        )

    def solve_optimization(self, gtg):
        self.G_param.value = gtg
        self.normalization_factor_param.value = self.normalization_factor
        alpha_t = self.prvs_alpha
        for _ in range(self.optim_niter):
            self.alpha_param.value = alpha_t
            self.prvs_alpha_param.value = alpha_t
            try:
                self.prob.solve(solver=self.cp.ECOS, warm_start=True, max_iters=100)
            except Exception:
                self.alpha_param.value = self.prvs_alpha_param.value
            if self._stop_criteria(gtg, alpha_t):
                break
            alpha_t = self.alpha_param.value
        return alpha_t


@pytest.mark.parametrize("tasks", [2, 3, 10])
def test_direct_ecos_solve_equals_the_authors_cvxpy_solve(tasks):
    # ECOS gets the conic program cvxpy compiles for the authors' problem: the same α, also over several steps'
    # warm starts and for Gramians of nearly parallel gradients (many convex problems per solve).
    rng = np.random.default_rng(tasks)
    ours = NashSolver(tasks, 20, "ECOS")
    for spread in (1.0, 0.3, 0.05):
        alpha = np.ones(tasks)
        for _ in range(3):
            jac = rng.normal(size=(tasks, 30)) * spread + rng.normal(size=30)
            gram = jac @ jac.T
            norm = float(np.linalg.norm(gram))
            expected = AuthorsSolve(tasks, norm, alpha).solve_optimization(gram / norm)
            alpha = ours(gram / norm, norm, alpha)
            np.testing.assert_allclose(alpha, expected, rtol=1e-9)


def test_other_solvers_go_through_cvxpy():
    # CLARABEL ships with cvxpy. Before: ECOS's max_iters option made every CLARABEL solve fail, α stayed at 1.
    pytest.importorskip("cvxpy")
    rng = np.random.default_rng(1)
    jac = rng.normal(size=(4, 9))
    gram = jac @ jac.T
    norm = float(np.linalg.norm(gram))
    alpha = NashSolver(4, 50, "CLARABEL")(gram / norm, norm, np.ones(4))
    np.testing.assert_allclose(alpha, NashSolver(4, 50, "ECOS")(gram / norm, norm, np.ones(4)), rtol=1e-4)


def test_matches_the_authors_code():
    model = make_model()
    history = train_ours(model, build(model), 4)
    for metrics, expected in zip(history, AUTHORS_ALPHA):
        assert [metrics[f"nash_mtl/alpha/{t}"].item() for t in TASKS3] == pytest.approx(expected, rel=1e-5)
    torch.testing.assert_close(model.trunk[0].weight, torch.tensor(AUTHORS_TRUNK0_WEIGHT), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.heads["b"].weight, torch.tensor(AUTHORS_HEAD_B_WEIGHT), rtol=1e-5, atol=1e-6)


def test_matches_torchjd_with_heads_at_weight_one():
    aggregation = pytest.importorskip("torchjd.aggregation")
    for every in (1, 2):
        ours, reference = make_model(), make_model()
        train_ours(ours, build(ours, head_weights="ones", update_weights_every=every), 6)
        train_torchjd(reference, aggregation.NashMTL(n_tasks=3, update_weights_every=every), 6)
        assert_same_parameters(ours, reference)


def test_resume_and_skipped_steps_keep_the_state():
    saved = assert_resume_and_skip_keep_the_state(
        lambda model: build(model, update_weights_every=2), first=3, resumed_seed=4
    )
    assert set(saved) == {"weighting.alpha", "weighting.steps"} and saved["weighting.steps"].item() == 3


def test_per_task_mode_weights_the_heads_after_the_solve():
    assert_per_task_is_the_joint_step(build, ("b", "a", "c"), BackwardContext())


def test_bad_options_fail_clearly():
    model = make_model()
    with pytest.raises(ValueError, match="^update_weights_every"):
        build(model, update_weights_every=0)
    with pytest.raises(ValueError, match="^max_norm"):
        build(model, max_norm=-1.0)
    with pytest.raises(ValueError, match="^head_weights"):
        build(model, head_weights="sum")
    with pytest.raises(ValueError, match="^solver: must be a solver's name"):
        build(model, solver=3)
    assert build(model, solver="ecos").weighting.solver == "ECOS"  # in any case, as cvxpy takes them
    pytest.importorskip("cvxpy")
    with pytest.raises(ValueError, match="^solver: NOPE is not installed"):
        build(model, solver="NOPE")
    with pytest.raises(ValueError, match="^solver: OSQP cannot solve Nash-MTL's problems"):
        build(model, solver="OSQP")
