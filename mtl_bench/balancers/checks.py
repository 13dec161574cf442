"""The balancers' option checks: one ValueError line naming the option, what it must be, and what it got."""

from __future__ import annotations

from typing import Any, Optional, Sequence


def number(
    name: str,
    value: Any,
    low: Optional[float] = None,
    high: Optional[float] = None,
    *,
    above: bool = False,
    below: bool = False,
    integer: bool = False,
    null: bool = False,
) -> Any:
    """`value` as a float (an int with `integer`; None when `null` allows it) if it is a number (not a bool) in
    [low, high] (`above`: low excluded, `below`: high excluded; None: unbounded), else ValueError:
    "beta: must be a number in [0, 1), got 2"."""
    if value is None and null:
        return None
    kinds = (int,) if integer else (int, float)
    ok = not isinstance(value, bool) and isinstance(value, kinds)
    if ok and low is not None:
        ok = value > low if above else value >= low
    if ok and high is not None:
        ok = value < high if below else value <= high
    if not ok or value != value:  # NaN compares false everywhere
        what = "an integer" if integer else "a number"
        if low is not None and high is not None:
            what += f" in {'(' if above else '['}{low}, {high}{')' if below else ']'}"
        elif low is not None:
            what += f" {'>' if above else '>='} {low}"
        elif high is not None:
            what += f" {'<' if below else '<='} {high}"
        raise ValueError(f"{name}: must be {what}{' or null' if null else ''}, got {value!r}")
    return value if integer else float(value)


def at_least(name: str, value: Any, low: float) -> float:
    return number(name, value, low)


def one_of(name: str, value: Any, allowed: Sequence[str]) -> str:
    """`value` if it is one of `allowed`, else ValueError: "group: 'x' is not one of whole_model, all_matrix"."""
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
    return value
