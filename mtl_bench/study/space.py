"""The trials of a tuning space: B points per method, the same B for every method.

Continuous keys are drawn by Latin hypercube sampling (McKay, Beckman & Conover 1979; scipy.stats.qmc): each key's
range is cut into B equal strata (in log space for loguniform) and every stratum gets exactly one trial, so a
budget of B covers the learning rate as a B-point grid would, without aligning the keys with each other.

Scalarization's task weights (static weights on the simplex, as in Xin et al. NeurIPS 2022 and Kurin et al.
NeurIPS 2022) come from a grid for T <= 3 tasks and are random (uniform on the simplex, Dirichlet(1)) beyond. The
grid is the simplex lattice of the smallest resolution n that has at least B interior points (every weight > 0:
a zero weight drops a task, which no multi-task run should), B of them taken in a seeded order. Weights are
scaled to sum to T, so equal weights are all ones, as balancer=fixed's default.
"""

from __future__ import annotations

import itertools
import math
import zlib
from typing import Any, Mapping

import numpy as np


def stream_seed(seed: int, name: str) -> int:
    """A seed of its own for each method (stable across processes and Python versions, unlike hash())."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**32


def rounded(x: float) -> float:
    """Four significant digits: what an override shows and what a run is trained with."""
    return float(f"{x:.4g}")


def latin_hypercube(space: Mapping[str, Mapping[str, Any]], n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """n points of `space` ({key: {loguniform|uniform: [lo, hi]} | {choice: [...]}}), one per stratum of each key."""
    from scipy.stats import qmc

    keys = list(space)
    if not keys:
        return [{} for _ in range(n)]
    unit = qmc.LatinHypercube(d=len(keys), seed=rng).random(n)
    points: list[dict[str, Any]] = [{} for _ in range(n)]
    for j, key in enumerate(keys):
        kind, args = next(iter(space[key].items()))
        for i in range(n):
            u = float(unit[i, j])
            if kind == "loguniform":
                lo, hi = math.log(args[0]), math.log(args[1])
                points[i][key] = rounded(math.exp(lo + u * (hi - lo)))
            elif kind == "uniform":
                points[i][key] = rounded(args[0] + u * (args[1] - args[0]))
            else:  # choice
                points[i][key] = list(args)[min(int(u * len(args)), len(args) - 1)]
    return points


def interior_lattice(tasks: int, n: int) -> list[tuple[int, ...]]:
    """Compositions of n into `tasks` positive parts: the simplex lattice's points with every weight > 0."""
    return [c for c in itertools.product(range(1, n + 1), repeat=tasks) if sum(c) == n]


def simplex_weights(tasks: list[str], n: int, rng: np.random.Generator) -> list[dict[str, float]]:
    """n task-weight vectors summing to len(tasks): a lattice grid for <= 3 tasks, Dirichlet(1) draws beyond."""
    t = len(tasks)
    if t <= 3:
        resolution = t
        while len(interior_lattice(t, resolution)) < n:
            resolution += 1
        grid = interior_lattice(t, resolution)
        chosen = [grid[i] for i in sorted(rng.permutation(len(grid))[:n])]
        vectors = [[c * t / resolution for c in point] for point in chosen]
    else:
        vectors = [list(v * t) for v in rng.dirichlet(np.ones(t), size=n)]
    order = rng.permutation(n)  # pair the grid with the learning rate's strata in a seeded order
    return [{task: rounded(float(w)) for task, w in zip(tasks, vectors[i])} for i in order]
