"""The balancers' option checks: one ValueError line naming the option, what it must be, and what it got."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import torch


def _range(low: Optional[float], high: Optional[float], above: bool, below: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if above else '['}{low}, {high}{')' if below else ']'}"
    if low is not None:
        return f" {'>' if above else '>='} {low}"
    if high is not None:
        return f" {'<' if below else '<='} {high}"
    return ""


def _fits(
    value: Any, low: Optional[float], high: Optional[float], above: bool, below: bool, integer: bool, finite: bool
) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float)) or value != value:
        return False  # a bool is an int to Python; NaN compares false everywhere
    if finite and not math.isfinite(value):
        return False
    if low is not None and not (value > low if above else value >= low):
        return False
    return high is None or (value < high if below else value <= high)


def number(
    name: str,
    value: Any,
    low: Optional[float] = None,
    high: Optional[float] = None,
    *,
    above: bool = False,
    below: bool = False,
    integer: bool = False,
    finite: bool = False,
    null: bool = False,
    note: str = "",
) -> Any:
    """`value` as a float (an int with `integer`; None when `null` allows it) if it is a number (not a bool) in
    [low, high] (`above`: low excluded, `below`: high excluded; None: unbounded; `finite`: no infinity), else
    ValueError: "beta: must be a number in [0, 1), got 2"; `note` follows the range ("for 2 tasks (at most T - 3)")."""
    if value is None and null:
        return None
    if not _fits(value, low, high, above, below, integer, finite):
        what = "an integer" if integer else "a finite number" if finite else "a number"
        what += _range(low, high, above, below) + (f" {note}" if note else "") + (" or null" if null else "")
        raise ValueError(f"{name}: must be {what}, got {value!r}")
    return value if integer else float(value)


def at_least(name: str, value: Any, low: float) -> float:
    return number(name, value, low)


def pair(name: str, value: Any, low: float, high: float, *, below: bool = False) -> tuple[float, float]:
    """Two numbers in [low, high] (`below`: high excluded), as floats (Adam's betas), else ValueError:
    "betas: must be two numbers in [0, 1), got [0.9, 1.0]"."""
    ok = not isinstance(value, (str, bytes)) and hasattr(value, "__len__") and len(value) == 2
    if not ok or not all(_fits(v, low, high, False, below, False, False) for v in value):
        raise ValueError(f"{name}: must be two numbers{_range(low, high, False, below)}, got {value!r}")
    return float(value[0]), float(value[1])


def one_of(name: str, value: Any, allowed: Sequence[str]) -> str:
    """`value` if it is one of `allowed`, else ValueError: "group: 'x' is not one of whole_model, all_matrix"."""
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
    return value


def stack_weights(weights: dict[str, float], task_names: list[str]) -> torch.Tensor:
    return torch.tensor([float(weights[name]) for name in task_names], dtype=torch.float32)


def task_weights(weights: Mapping[str, float] | None, task_names: list[str]) -> dict[str, float]:
    """Weights for exactly `task_names`: None means 1.0 each; any mismatch or negative weight is a ValueError."""
    if weights is None:
        return {name: 1.0 for name in task_names}
    unknown = sorted(set(weights) - set(task_names))
    missing = sorted(set(task_names) - set(weights))
    if unknown or missing:
        problems = ([f"weights for unknown tasks {unknown}"] if unknown else []) + (
            [f"no weight for tasks {missing}"] if missing else []
        )
        raise ValueError(f"weights: {'; '.join(problems)}; the task set has tasks {list(task_names)}")
    return {name: at_least(f"weights.{name}", weights[name], 0) for name in task_names}
