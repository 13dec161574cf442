"""Indicators of a front of per-task losses (all minimised), from pymoo (Blank & Deb, IEEE Access 2020):
hypervolume (`pymoo.indicators.hv.HV`), inverted generational distance (`igd.IGD`) and Schott's spacing
(`spacing.SpacingIndicator`)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mtl_bench.errors import ConfigError

Points = Sequence[Sequence[float]]


def require_pymoo() -> None:
    try:
        import pymoo  # noqa: F401
    except ImportError:
        raise ConfigError(
            "pymoo, which the front metrics (hypervolume, IGD, spacing) need, is not installed: "
            "pip install pymoo (a dependency of mtl-bench missing here)"
        ) from None


def _array(points: Points) -> np.ndarray:
    array = np.asarray(points, dtype=float)
    if array.ndim != 2:
        raise ValueError(f"points: expected a list of points of equal length, got shape {array.shape}")
    return array


def non_dominated(points: Points) -> np.ndarray:
    """The points no other point dominates (pymoo's non-dominated sorting, first front), in their order."""
    require_pymoo()
    from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting

    array = _array(points)
    if len(array) == 0:
        return array
    first = np.sort(NonDominatedSorting().do(array, only_non_dominated_front=True))
    return array[first]


def hypervolume(points: Points, reference: Sequence[float]) -> float:
    """The volume dominated by the points and bounded by the reference point (points beyond it add nothing)."""
    require_pymoo()
    from pymoo.indicators.hv import HV

    array = _array(points)
    ref = np.asarray(reference, dtype=float)
    if array.shape[1] != len(ref):
        raise ValueError(f"reference: {len(ref)} values for points of {array.shape[1]} objectives")
    inside = array[np.all(array < ref, axis=1)]
    return float(HV(ref_point=ref)(inside)) if len(inside) else 0.0


def igd(points: Points, reference_front: Points) -> float:
    """Mean distance from each point of the reference front to the nearest of `points`."""
    require_pymoo()
    from pymoo.indicators.igd import IGD

    return float(IGD(_array(reference_front))(_array(points)))


def spacing(points: Points) -> float:
    """Schott's spacing of the non-dominated points (0: evenly spread; needs two or more)."""
    require_pymoo()
    from pymoo.indicators.spacing import SpacingIndicator

    front = non_dominated(points)
    if len(front) < 2:
        return float("nan")
    return float(SpacingIndicator(pf=front)(front))


def front_summary(points: Points, reference: Optional[Sequence[float]]) -> dict[str, float]:
    """hypervolume (with a reference point), spacing, and how many points are non-dominated."""
    out = {"non_dominated": float(len(non_dominated(points))), "spacing": spacing(points)}
    if reference is not None:
        out["hypervolume"] = hypervolume(points, reference)
    return out
