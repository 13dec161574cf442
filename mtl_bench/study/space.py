"""The trials of a tuning space: B points per method, the same B for every method.

Continuous keys are drawn by Latin hypercube sampling (McKay, Beckman & Conover 1979; scipy.stats.qmc): each key's
range is cut into B equal strata (in log space for loguniform) and every stratum gets exactly one trial, so a
budget of B covers the learning rate as a B-point grid would, without aligning the keys with each other.

Scalarization's static task weights (`scalarization.weights`), always with equal weights as trial 0, so the
tuned baseline contains its own special case:
- loguniform (the default): each task's weight log-uniform in `scalarization.range` ([0.1, 10]: ratios up to 100,
  enough for tasks whose losses differ in scale by 6x and more), B - 1 Latin hypercube points;
- lattice: the simplex lattice of the smallest resolution n with at least B - 1 interior points other than the
  centre (every weight > 0: a zero weight drops a task, which no multi-task run should), taken in a seeded order;
  the grid Xin et al. (NeurIPS 2022) sweep for two tasks;
- dirichlet: uniform on the simplex (Dirichlet(1)); for many tasks it almost never draws weights far from each
  other in ratio, and never equal ones.
Weights are scaled to sum to T, so equal weights are all ones, as balancer=fixed's default.
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


def scalarization_weights(
    tasks: list[str],
    n: int,
    rng: np.random.Generator,
    kind: str = "loguniform",
    bounds: tuple[float, float] = (0.1, 10),
) -> list[dict[str, float]]:
    """n task-weight vectors summing to len(tasks), the first equal weights (all ones), the rest from `kind`."""
    t = len(tasks)
    vectors: list[list[float]] = [[1.0] * t]
    others = n - 1
    if others > 0 and kind == "loguniform":
        space = {task: {"loguniform": list(bounds)} for task in tasks}
        vectors += [[p[task] for task in tasks] for p in latin_hypercube(space, others, rng)]
    elif others > 0 and kind == "lattice":
        resolution = t
        while len(interior_lattice(t, resolution)) - (resolution % t == 0) < others:
            resolution += 1
        grid = [c for c in interior_lattice(t, resolution) if len(set(c)) > 1]  # the centre is trial 0
        vectors += [list(grid[i]) for i in sorted(rng.permutation(len(grid))[:others])]
    elif others > 0:
        vectors += [list(v) for v in rng.dirichlet(np.ones(t), size=others)]
    return [{task: rounded(float(w) * t / sum(v)) for task, w in zip(tasks, v)} for v in vectors]
