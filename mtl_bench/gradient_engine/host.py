"""Host solutions: a T×T problem solved on the CPU (Frank-Wolfe, active sets, SLSQP, cvxpy) from the Gramian as
float64 numpy, its weights back on the device."""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from mtl_bench.balancers.weighting import Solution


def host_gramian(gram: Tensor) -> Optional[np.ndarray]:
    """G as float64 numpy for a CPU solver, or None when it is not finite (a skipped step: NaN weights).

    On a GPU this is the step's one device-to-host copy (a sync): small iterative solvers with
    data-dependent branches (Frank-Wolfe, active sets, SLSQP, cvxpy) run far faster on the host than as
    hundreds of tiny kernels.
    """
    g = gram.detach().to("cpu", torch.float64).numpy()
    return g if np.isfinite(g).all() else None


def to_device(values: np.ndarray | Sequence[float], like: Tensor) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float32)).to(like.device)


def nan_weights(t: int, like: Tensor) -> Tensor:
    return torch.full((t,), math.nan, device=like.device)


def host_solution(gram: Tensor, metric: str, solve: Callable[[np.ndarray], tuple[np.ndarray, float]]) -> Solution:
    """The weights of a host solver, `solve(G) -> (weights, value)` on G as float64 numpy, and `metric` = value;
    NaN weights and a NaN `metric` when G is not finite (a skipped step)."""
    g = host_gramian(gram)
    if g is None:
        return Solution(
            nan_weights(gram.shape[0], gram), metrics={metric: torch.full((), math.nan, device=gram.device)}
        )
    weights, value = solve(g)
    return Solution(to_device(weights, gram), metrics={metric: torch.tensor(float(value), device=gram.device)})
