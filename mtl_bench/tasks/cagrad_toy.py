"""The illustrative two-objective problem of CAGrad (Liu et al., NeurIPS 2021, Cranial-XIX/CAGrad `toy.py`), as reused
with the first loss scaled by 0.1 by Nash-MTL (Navon et al., ICML 2022, Fig. 1; AvivNavon/nash-mtl `experiments/toy/`)
and FAMO (Liu et al., NeurIPS 2023; Cranial-XIX/FAMO `experiments/toy/`).

x = (x1, x2) in R^2 is the model's parameter (model=decision); there are no data. With
c1 = max(tanh(x2/2), 0), c2 = max(tanh(-x2/2), 0) and l = 5e-6 (the references' clamp):

    f1(x) = scale * [c1 (log max(|-(x1+7)/2 - tanh(-x2)|, l) + 6) + c2 (((x1-7)^2 + 0.1 (x2+8)^2)/10 - 20)]
    f2(x) =          c1 (log max(|-(x1-3)/2 + tanh(-x2) + 2|, l) + 6) + c2 (((x1+7)^2 + 0.1 (x2+8)^2)/10 - 20)

computed with the references' operations. max(t, m) is theirs, torch.clamp(t, m), with the gradient it had when the
papers were written: 1 at t = m (pytorch/pytorch#7049, 2018). Torch releases since mid-2026 give 0 there
(pytorch/pytorch#184574); under them the references' start (0, 0), where c1 = c2 = 0, has a zero gradient and never
moves, while in the papers' figures it does. scale = 1 in CAGrad, 0.1 in Nash-MTL and FAMO.

The Pareto set lies where x2 < 0 (both objectives there reach about -20 scale-free, against > -6.3 where x2 > 0). A
point is Pareto stationary when l*grad f1 + (1-l)*grad f2 = 0 for some l in [0, 1]: the first coordinate gives
x1 = 14 l - 7 and the weighted objective, minimised over x1, is tanh(-x2/2) (19.6 l(1-l) - 20 + 0.01 (x2+8)^2); so the
set is the curve {(14 l - 7, x2*(l))}, x2* minimising that in x2, and every point of it minimises the weighted sum
l f1/scale + (1-l) f2: it is Pareto optimal (the scale does not move it). x2* is -8.4345 at the ends (l = 0, 1: the
minima of f2 at x1 = -7 and of f1 at x1 = 7) and -8.3551 at x1 = 0. The papers draw the straight segment
x2 = -8.3552, x1 in [-7, 7] (their `yy`): exact at x1 = 0, 0.079 above the set at the ends.

Tasks "f1" and "f2": loss f_i(x) (the mean over the batch, whose rows all see the same x). Metrics (lower is better):
`value` (f_i(x), the objective as trained: the loss itself, listed as a metric so that tables of metrics show it);
and on the first task, for the point x rather than for f1, `stationarity` (the norm of the min-norm element of the
convex hull of grad f1 and grad f2, in closed form for two vectors, 0 exactly at a Pareto-stationary point) and
`pareto_dist` (the Euclidean distance from x to the Pareto set above). metrics.json is per task, so these two
properties of x are reported once, under the first task; they read both objectives' gradients at x, which this
task set knows (autograd of the same f_i).
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

import numpy as np
import torch
from torch import Tensor

from mtl_bench.tasks.base import Split, Task, TaskSet

LOWER = 0.000005  # the references' clamp inside the log
TASKS = ("f1", "f2")


def at_least(t: Tensor, low: float) -> Tensor:
    """max(t, low) with gradient 1 at t = low: torch.clamp(t, low) as the papers' torch differentiated it."""
    return torch.where(t >= low, t, torch.full_like(t, low))


def objective(x: Tensor, i: int, scale: float = 0.1) -> Tensor:
    """(..., 2) points -> (...,) values of f1 (i = 0) or f2 (i = 1), computed as the references do."""
    x1, x2 = x[..., 0], x[..., 1]
    if i == 0:
        log_term = at_least((0.5 * (-x1 - 7) - torch.tanh(-x2)).abs(), LOWER).log() + 6
        square = ((-x1 + 7).pow(2) + 0.1 * (-x2 - 8).pow(2)) / 10 - 20
    else:
        log_term = at_least((0.5 * (-x1 + 3) + torch.tanh(-x2) + 2).abs(), LOWER).log() + 6
        square = ((-x1 - 7).pow(2) + 0.1 * (-x2 - 8).pow(2)) / 10 - 20
    value = log_term * at_least(torch.tanh(x2 * 0.5), 0) + square * at_least(torch.tanh(-x2 * 0.5), 0)
    return value * scale if i == 0 else value


def objectives(x: Tensor, scale: float = 0.1) -> Tensor:
    """(..., 2) points -> (..., 2) values (f1, f2)."""
    return torch.stack([objective(x, 0, scale), objective(x, 1, scale)], dim=-1)


def gradients(x: Tensor, scale: float = 0.1) -> Tensor:
    """(N, 2) points -> (N, 2, 2): [n, i] is grad f_i at x[n] (autograd of `objectives`, also under no_grad)."""
    with torch.enable_grad():
        point = x.detach().clone().requires_grad_(True)
        values = objectives(point, scale)
        rows = [torch.autograd.grad(values[:, i].sum(), point, retain_graph=i == 0)[0] for i in range(2)]
    return torch.stack(rows, dim=1)


def min_norm_element(g1: Tensor, g2: Tensor) -> Tensor:
    """The point of the segment [g1, g2] nearest the origin (rows: one pair each): g2 + t (g1 - g2) with
    t = clip(g2.(g2 - g1) / |g1 - g2|^2, 0, 1); t = 0 when g1 = g2."""
    diff = g1 - g2
    denom = (diff * diff).sum(-1, keepdim=True)
    t = torch.where(denom > 0, (g2 * -diff).sum(-1, keepdim=True) / denom.clamp_min(1e-300), torch.zeros_like(denom))
    return g2 + t.clamp(0.0, 1.0) * diff


def stationarity(x: Tensor, scale: float = 0.1) -> Tensor:
    """(N, 2) -> (N,): ||min-norm element of conv{grad f1(x), grad f2(x)}||; 0 iff x is Pareto stationary."""
    grads = gradients(x, scale)
    return min_norm_element(grads[:, 0], grads[:, 1]).norm(dim=-1)


def pareto_set(points: int = 4001) -> np.ndarray:
    """(points, 2) float64 points of the Pareto set, x1 = 14 l - 7 for l evenly spaced in [0, 1], x2 = x2*(l)
    (the root of the weighted objective's derivative in x2, by bisection to float64 precision)."""
    lam = np.linspace(0.0, 1.0, points)
    a = 19.6 * lam * (1 - lam) - 20

    def slope(x2: np.ndarray) -> np.ndarray:  # d/dx2 of tanh(-x2/2) (a + 0.01 (x2+8)^2)
        return -0.5 / np.cosh(x2 / 2) ** 2 * (a + 0.01 * (x2 + 8) ** 2) + np.tanh(-x2 / 2) * 0.02 * (x2 + 8)

    lo, hi = np.full(points, -10.0), np.full(points, -7.0)  # slope < 0 at -10, > 0 at -7 for every l
    for _ in range(80):
        mid = (lo + hi) / 2
        negative = slope(mid) < 0
        lo, hi = np.where(negative, mid, lo), np.where(negative, hi, mid)
    return np.stack([14 * lam - 7, (lo + hi) / 2], axis=1)


def distance_to_polyline(x: Tensor, polyline: Tensor) -> Tensor:
    """(N, 2) points, (M, 2) vertices -> (N,) the distance of each point to the polyline."""
    a, b = polyline[:-1], polyline[1:]
    ab = b - a
    ap = x[:, None, :] - a[None]
    t = ((ap * ab).sum(-1) / (ab * ab).sum(-1)).clamp(0.0, 1.0)
    nearest = a[None] + t[..., None] * ab[None]
    return (x[:, None, :] - nearest).norm(dim=-1).min(dim=1).values


class CAGradToy(TaskSet):
    """Tasks "f1", "f2" of the CAGrad/Nash-MTL/FAMO toy (module docstring); train it with model=decision."""

    def __init__(
        self,
        scale: float = 0.1,
        n_train: int = 1,
        n_val: int = 1,
        n_test: int = 1,
        reference: Optional[Mapping[str, Mapping[str, float]]] = None,
    ) -> None:
        """
        scale: the factor of the first objective (> 0): 0.1 in Nash-MTL and FAMO, 1 in CAGrad.
        n_train: rows of the training split (> 0). Every row sees the same x, so the losses do not depend on it;
            trainer.batch_size may not exceed it.
        n_val: rows of the validation split (> 0; the metrics do not depend on it).
        n_test: rows of the test split (> 0; the metrics do not depend on it).
        reference: single-task metrics {task: {metric: value}} for `mtl-bench report -b reference`.
        """
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0 or math.isinf(scale):
            raise ValueError(f"scale: must be a finite number > 0, got {scale!r}")
        rows = {"train": n_train, "val": n_val, "test": n_test}
        for split, n in rows.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"n_{split}: must be an integer > 0, got {n!r}")
        self.scale = float(scale)
        curve = torch.from_numpy(pareto_set()).float()

        def loss_of(i: int):
            def loss(pred: Tensor, target: Tensor) -> Tensor:
                return objective(pred, i, self.scale).mean()

            return loss

        def metrics_of(i: int):
            def metrics(pred: Tensor, target: Tensor) -> dict[str, Tensor]:
                x = pred.detach()
                sums = {"value": objective(x, i, self.scale).sum()}
                if i == 0:  # properties of the point x, reported once (module docstring)
                    sums["stationarity"] = stationarity(x, self.scale).sum()
                    sums["pareto_dist"] = distance_to_polyline(x.float(), curve.to(x.device)).sum()
                return sums

            return metrics

        tasks = [
            Task(
                name=name,
                out_dim=2,
                loss=loss_of(i),
                metrics=metrics_of(i),
                higher_is_better={"value": False, **({"stationarity": False, "pareto_dist": False} if i == 0 else {})},
            )
            for i, name in enumerate(TASKS)
        ]
        # Dummy rows: the model ignores its input, and every row sees the same x.
        splits = {s: Split(torch.zeros(n, 1), {name: torch.zeros(n, 1) for name in TASKS}) for s, n in rows.items()}
        super().__init__(tasks, (1,), reference=reference, **splits)
