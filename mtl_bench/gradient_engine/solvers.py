"""Small T×T solvers on the Gramian (float64 numpy on the host): min-norm point of the simplex (MGDA) and the
bound-constrained QP of UPGrad's dual-cone projection."""

from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------------------------------------- MGDA


def _min_norm_of_two(v1v1: float, v1v2: float, v2v2: float) -> tuple[float, float]:
    """min over γ∈[0,1] of ‖γ v1 + (1−γ) v2‖²: (γ, cost); the end points are 0.999/0.001 as in the
    reference code of Sener & Koltun (and LibMTL)."""
    if v1v2 >= v1v1:
        return 0.999, v1v1
    if v1v2 >= v2v2:
        return 0.001, v2v2
    gamma = -(v1v2 - v2v2) / (v1v1 + v2v2 - 2 * v1v2)
    return gamma, v2v2 + gamma * (v1v2 - v2v2)


def project_to_simplex(y: np.ndarray) -> np.ndarray:
    """Euclidean projection onto the probability simplex (the sort-based rule of the reference code)."""
    m = len(y)
    sorted_y = np.sort(y)[::-1]
    tmpsum, tmax_f = 0.0, (y.sum() - 1.0) / m
    for i in range(m - 1):
        tmpsum += sorted_y[i]
        tmax = (tmpsum - 1) / (i + 1.0)
        if tmax > sorted_y[i + 1]:
            tmax_f = tmax
            break
    return np.maximum(y - tmax_f, 0.0)


def _next_point(cur: np.ndarray, grad: np.ndarray) -> np.ndarray:
    n = len(cur)
    proj = grad - grad.sum() / n
    neg, pos = proj < 0, proj > 0
    tm1 = -cur[neg] / proj[neg]
    tm2 = (1.0 - cur[pos]) / proj[pos]
    t = 1.0
    if (tm1 > 1e-7).any():
        t = tm1[tm1 > 1e-7].min()
    if (tm2 > 1e-7).any():
        t = min(t, tm2[tm2 > 1e-7].min())
    return project_to_simplex(proj * t + cur)


def min_norm_simplex(gram: np.ndarray, max_iter: int = 250, stop: float = 1e-5) -> np.ndarray:
    """argmin_{w ∈ simplex} wᵀ G w by the projected Frank-Wolfe of Sener & Koltun's MinNormSolver
    (isl-org/MultiObjectiveOptimization; LibMTL's MGDA copies it): the best pair first (exact for T = 2),
    then at most `max_iter` steps until the weights move less than `stop` (L1)."""
    n = gram.shape[0]
    if n == 1:
        return np.ones(1)
    best = None
    for i in range(n):
        for j in range(i + 1, n):
            gamma, cost = _min_norm_of_two(gram[i, i], gram[i, j], gram[j, j])
            if best is None or cost < best[0]:
                best = (cost, i, j, gamma)
    assert best is not None
    _, i, j, gamma = best
    sol = np.zeros(n)
    sol[i], sol[j] = gamma, 1 - gamma
    if n < 3:
        return sol
    for _ in range(max_iter):
        new_point = _next_point(sol, -gram @ sol)
        v1v1 = sol @ gram @ sol
        v1v2 = sol @ gram @ new_point
        v2v2 = new_point @ gram @ new_point
        nc, _ = _min_norm_of_two(v1v1, v1v2, v2v2)
        new_sol = nc * sol + (1 - nc) * new_point
        if np.abs(new_sol - sol).sum() < stop:
            return sol
        sol = new_sol
    return sol


# ---------------------------------------------------------------------------------------------- UPGrad


def nonneg_qps(gram: np.ndarray, linears: np.ndarray) -> np.ndarray:
    """argmin_{x ≥ 0} ½ xᵀ G x + cᵀ x for every row c of `linears` (k, n), G symmetric positive semi-definite.

    With G = L Lᵀ positive definite, ½ xᵀGx + cᵀx = ½ ‖Lᵀx + L⁻¹c‖² − ½ ‖L⁻¹c‖²: a non-negative least-squares
    problem, solved exactly by scipy's compiled NNLS (Lawson & Hanson's active-set method) on one factorisation
    for all rows: about 3x faster than the same method in numpy (`active_set_qp`), which is kept for a G whose
    Cholesky factorisation fails."""
    from scipy.linalg import solve_triangular
    from scipy.optimize import nnls

    try:
        factor = np.linalg.cholesky(gram)
    except np.linalg.LinAlgError:
        return np.stack([active_set_qp(gram, c) for c in linears])
    targets = -solve_triangular(factor, linears.T, lower=True)
    return np.stack([nnls(factor.T, targets[:, k])[0] for k in range(len(linears))])


def nonneg_qp(gram: np.ndarray, linear: np.ndarray) -> np.ndarray:
    """argmin_{x ≥ 0} ½ xᵀ G x + cᵀ x (`nonneg_qps` for one c)."""
    return nonneg_qps(gram, linear[None])[0]


def active_set_qp(gram: np.ndarray, linear: np.ndarray, tol: float = 1e-12, max_iter: int = 500) -> np.ndarray:
    """argmin_{x ≥ 0} ½ xᵀ G x + cᵀ x by the active-set method of Lawson & Hanson's NNLS on the QP's normal
    equations (finite; T×T solves only)."""
    n = len(linear)
    x = np.zeros(n)
    free = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        dual = -(gram @ x + linear)
        candidates = np.where(~free & (dual > tol * max(1.0, np.abs(dual).max())))[0]
        if len(candidates) == 0:
            break
        free[candidates[np.argmax(dual[candidates])]] = True
        while True:
            z = np.zeros(n)
            idx = np.where(free)[0]
            z[idx] = np.linalg.solve(gram[np.ix_(idx, idx)], -linear[idx])
            if (z[idx] > 0).all():
                x = z
                break
            blocking = idx[z[idx] <= 0]
            step = np.min(x[blocking] / (x[blocking] - z[blocking]))
            x = x + step * (z - x)
            free &= x > tol
            x[~free] = 0.0
    return x


def dual_cone_weights(gram: np.ndarray, u: np.ndarray) -> np.ndarray:
    """v = argmin vᵀ G v subject to v ≥ u (torchjd's projection of Jᵀu onto the dual cone of J's rows, in
    weight space): with x = v − u ≥ 0 it is a non-negative QP. `u` (n,), or (k, n): one projection per row."""
    rows = np.atleast_2d(u)
    v = rows + nonneg_qps(gram, rows @ gram)  # G is symmetric: row k of U G is G u_k
    return v.reshape(u.shape)
