"""Navon et al., ICML 2022, "Multi-Task Learning as a Bargaining Game" (Nash-MTL)."""

from __future__ import annotations

from functools import partial
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
import torch
from scipy.sparse import csc_matrix
from torch import Tensor

from mtl_bench.balancers.checks import at_least, number, one_of
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer
from mtl_bench.gradient_engine.host import host_gramian, nan_weights, to_device

HEAD_WEIGHTS = ("alpha", "ones")


# ECOS's exit flags with a solution (optimal, inaccurate, iteration limit) and with a certificate of
# infeasibility or unboundedness; the others are solver errors (cvxpy's ECOS interface maps them the same way).
ECOS_SOLVED, ECOS_NO_SOLUTION = (0, 10, -1), (1, 2, 11, 12)


class NashSolver:
    """The paper's sequence of convex problems for the bargaining solution Gα = 1/α (α > 0), on the Gramian
    normalised by its Frobenius norm n: each step minimises Σ(Gα) + φ̃(α)/n subject to α_i·n·(Gα)_i ≥ 1, with
    φ̃ the linearisation of φ(α) = Σ log α_i + Σ log (Gα)_i at the previous iterate, until Gα ≈ 1/α or α stops
    moving (at most `iterations`). Warm-started from the last solution. Solved on the host (a sync): with ECOS
    called directly on the conic program cvxpy compiles for the reference's problem (the same data, so the
    same bits; cvxpy's parameter handling cost about 4x ECOS's own time), with any other solver through cvxpy."""

    def __init__(self, tasks: int, iterations: int, solver: str) -> None:
        self.tasks, self.iterations, self.solver = tasks, iterations, solver
        if solver == "ECOS":
            try:
                import ecos
            except ImportError as error:  # pragma: no cover - depends on the environment
                raise ImportError("nash_mtl with solver=ECOS needs the ecos package: pip install ecos") from error
            self.ecos = ecos
            return
        try:
            import cvxpy as cp
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError(f"nash_mtl with solver={solver} needs cvxpy: pip install cvxpy") from error
        if solver not in cp.installed_solvers():
            raise ValueError(
                f"solver: {solver} is not installed for cvxpy (installed: {', '.join(cp.installed_solvers())}); "
                "pip install ecos for solver=ECOS, or solver=CLARABEL"
            )
        self.cp = cp
        self.alpha = cp.Variable(tasks, nonneg=True)
        self.gram = cp.Parameter((tasks, tasks), value=np.eye(tasks))
        self.norm = cp.Parameter(1, nonneg=True, value=np.ones(1))
        # φ̃(α)/n = slope·(α − α_prev)/n; the constant −slope·α_prev/n does not move the minimum, and the slope
        # (computed on the host) is one parameter, so the problem is DPP: cvxpy compiles it once.
        self.slope = cp.Parameter(tasks, value=np.zeros(tasks))
        gram_alpha = self.gram @ self.alpha
        constraints = [-cp.log(self.alpha[i] * self.norm) - cp.log(gram_alpha[i]) <= 0 for i in range(tasks)]
        self.problem = cp.Problem(cp.Minimize(cp.sum(gram_alpha) + self.slope @ self.alpha), constraints)
        try:  # once at G = I, so that a solver that cannot take exponential cones stops the run here
            self.problem.solve(solver=solver)
        except cp.error.SolverError as error:
            raise ValueError(
                f"solver: {solver} cannot solve Nash-MTL's problems ({error}); use ECOS or CLARABEL"
            ) from None

    def __call__(self, gram: np.ndarray, norm: float, start: np.ndarray) -> np.ndarray:
        solve = self._ecos_problem(gram, norm) if self.solver == "ECOS" else self._cvxpy_problem(gram, norm)
        alpha = start
        for _ in range(self.iterations):
            solution = solve((1 / alpha + (1 / (gram @ alpha)) @ gram) / norm, alpha)
            if (
                solution is None
                or np.linalg.norm(gram @ alpha - 1 / (alpha + 1e-10)) < 1e-3
                or np.linalg.norm(solution - alpha) < 1e-6
            ):
                break
            alpha = solution
        return alpha

    def _ecos_problem(self, gram: np.ndarray, norm: float) -> Callable[[np.ndarray, np.ndarray], Optional[np.ndarray]]:
        """min cᵀx over x = (α, u, v) with α ≥ 0, u + v ≥ 0, u_i ≤ log(n·α_i), v_i ≤ log((Gα)_i), in ECOS's form
        h − Gx ∈ K: 2T linear rows, then per task the exponential cones (u_i, n·α_i, 1) and (v_i, (Gα)_i, 1)
        (ECOS orders a cone's entries (x, y, z) with z·exp(x/z) ≤ y). A failed solve keeps the current α."""
        t, rows = self.tasks, np.arange(self.tasks)
        matrix, offsets = np.zeros((8 * t, 3 * t)), np.zeros(8 * t)
        matrix[rows, rows] = -1
        matrix[t + rows, t + rows] = matrix[t + rows, 2 * t + rows] = -1
        cones = 2 * t + 6 * rows
        matrix[cones, t + rows], matrix[cones + 1, rows], offsets[cones + 2] = -1, -norm, 1
        matrix[cones + 3, 2 * t + rows], matrix[cones + 4, :t], offsets[cones + 5] = -1, -gram, 1
        sparse, dims, column_sums = csc_matrix(matrix), {"l": 2 * t, "q": [], "e": 2 * t}, gram.sum(0)

        def solve(slope: np.ndarray, alpha: np.ndarray) -> Optional[np.ndarray]:
            objective = np.concatenate([column_sums + slope, np.zeros(2 * t)])
            answer = self.ecos.solve(objective, sparse, offsets, dims, verbose=False, max_iters=100)
            flag = answer["info"]["exitFlag"]
            return answer["x"][:t] if flag in ECOS_SOLVED else None if flag in ECOS_NO_SOLUTION else alpha

        return solve

    def _cvxpy_problem(self, gram: np.ndarray, norm: float) -> Callable[[np.ndarray, np.ndarray], Optional[np.ndarray]]:
        self.gram.value, self.norm.value = gram, np.array([norm])

        def solve(slope: np.ndarray, alpha: np.ndarray) -> Optional[np.ndarray]:
            self.alpha.value, self.slope.value = alpha, slope
            try:  # the solver's own options: ECOS's max_iters=100 is not every solver's option
                self.problem.solve(solver=self.solver, warm_start=True)
            except self.cp.error.SolverError:  # the reference keeps the previous point when the solver fails
                return alpha
            return self.alpha.value

        return solve


class NashMTLWeighting(Weighting):
    """The Nash bargaining solution: d = Σ_i α_i g_i with (Gα)_i = 1/α_i, so every task's improvement
    g_i·d = 1/α_i gets a fair share (`NashSolver`); the shared update is clipped to norm `max_norm` and the
    heads are trained on Σ_i α_i L_i (`head_weights="alpha"`, the authors' code). α is recomputed every
    `update_weights_every` steps and reused in between; the last α warm-starts the next solve.

    Reference: the authors' code (AvivNavon/nash-mtl, methods/weight_methods.py `NashMTL`), which LibMTL main
    `Nash_MTL` and torchjd 0.18 `NashMTL` copy (torchjd gives the heads weight 1: `head_weights="ones"`; it
    clips by scaling α, the same thing). The previous α and the step count are buffers (checkpointed; a
    skipped step changes neither). Needs the ecos package (or cvxpy with another `solver`); the solve runs on
    the host, one sync per update step. The Jacobian is computed on every step, also when α is reused.

    Metrics: `weight/<task>` (α after clipping), `grad_norm/<task>`, `grad_cos/<a>/<b>`, `nash_mtl/alpha/<task>`
    (α before clipping), `nash_mtl/update_norm` (‖d‖ before clipping).
    """

    HOST_SOLVE = "the Nash bargaining program (ECOS, or any solver through cvxpy)"

    alpha: Tensor
    steps: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        update_weights_every: int = 1,
        optim_niter: int = 20,
        max_norm: float = 1.0,
        head_weights: str = "alpha",
        solver: str = "ECOS",
    ) -> None:
        """
        task_names: the tasks, sorted (given by the engine).
        update_weights_every: solve for α every this many steps (>= 1), reuse it in between.
        optim_niter: the most convex problems per solve (>= 1).
        max_norm: clip the shared update to this norm (0: no clipping).
        head_weights: the heads' loss weights: alpha (the authors' code) or ones (torchjd).
        solver: the solver of each convex problem: ECOS as the reference (called directly), or any other solver
            cvxpy has installed (CLARABEL ships with cvxpy).
        """
        super().__init__()
        self.task_names = list(task_names)
        self.update_weights_every = number("update_weights_every", update_weights_every, 1, integer=True)
        self.optim_niter = number("optim_niter", optim_niter, 1, integer=True)
        self.max_norm = at_least("max_norm", max_norm, 0)
        one_of("head_weights", head_weights, HEAD_WEIGHTS)
        if not isinstance(solver, str) or not solver:
            raise ValueError(f"solver: must be a solver's name (ECOS, or one cvxpy has installed), got {solver!r}")
        self.head_weights, self.solver = head_weights, solver.upper()  # cvxpy names its solvers in capitals
        self.weighs_heads = head_weights == "alpha"
        self._solver = NashSolver(len(self.task_names), optim_niter, self.solver)  # checks the solver is installed now
        self.register_buffer("alpha", torch.ones(len(self.task_names)))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def __getstate__(self) -> dict:
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state.pop("_solver", None)  # cvxpy problems do not copy; rebuilt on demand
        return state

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        t = len(self.task_names)
        g = host_gramian(gram)
        if g is None:
            return Solution(nan_weights(t, gram), nan_weights(t, gram))
        steps = int(self.steps)  # a host read of a CPU-side counter (the buffer follows the module's device)
        alpha = self.alpha.detach().to("cpu", torch.float64).numpy()
        if steps % self.update_weights_every == 0:
            norm = float(np.linalg.norm(g))
            if "_solver" not in self.__dict__:
                self._solver = NashSolver(t, self.optim_niter, self.solver)
            alpha = np.asarray(self._solver(g / norm, norm, alpha), dtype=np.float64)
        update_norm = float(np.sqrt(max(alpha @ g @ alpha, 0.0)))
        clip = min(1.0, self.max_norm / (update_norm + 1e-6)) if self.max_norm > 0 else 1.0
        metrics = {f"nash_mtl/alpha/{name}": v for name, v in zip(self.task_names, to_device(alpha, gram).unbind())}
        metrics["nash_mtl/update_norm"] = torch.tensor(update_norm, device=gram.device)
        heads = to_device(alpha, gram) if self.head_weights == "alpha" else None
        state = {"alpha": to_device(alpha, self.alpha), "steps": self.steps + 1}
        return Solution(to_device(alpha * clip, gram), heads, metrics, state)


class NashMTL(GramianBalancer):
    """NashMTL (`NashMTLWeighting`) as a balancer: `balancer=nash_mtl`; at the shared parameters, as its reference."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        update_weights_every: int = 1,
        optim_niter: int = 20,
        max_norm: float = 1.0,
        head_weights: str = "alpha",
        solver: str = "ECOS",
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        The gradients are taken at the shared parameters only, as in the reference (no grad_source option).
        update_weights_every: solve for α every this many steps (>= 1), reuse it in between.
        optim_niter: the most convex problems per solve (>= 1).
        max_norm: clip the shared update to this norm (0: no clipping).
        head_weights: the heads' loss weights: alpha (the authors' code) or ones (torchjd).
        solver: the solver of each convex problem: ECOS as the reference (called directly), or any other solver
            cvxpy has installed (CLARABEL ships with cvxpy).
        """
        super().__init__(
            task_names,
            shared_params,
            partial(
                NashMTLWeighting,
                update_weights_every=update_weights_every,
                optim_niter=optim_niter,
                max_norm=max_norm,
                head_weights=head_weights,
                solver=solver,
            ),
        )
