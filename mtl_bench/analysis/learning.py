"""Did a completed run learn? A run whose training loss never moved is listed apart, never ranked.

The rule (our own; the margin is a choice, not from a paper): a run did not learn when no task's training loss fell
by MARGIN (5%) of its first logged value:

    max_t (L_t(first) − L_t(last)) / |L_t(first)|  <  MARGIN

The best task decides, not the mean: a run whose weights favour one task (equal weights on GradNorm's toy, where
one loss is 10⁴ times the other) learns that task while the other gets worse; it learned, and Δm judges the
balance. A run that learned nothing (a learning rate too small to move anything, frozen parameters) moves no task.

with L_t the `loss/<task>` scalars the loop logged every `log_every` steps, read from whichever shipped logger
wrote them (TensorBoard's events or the CSV logger's file: analysis/scalars.py).
A run with fewer than MIN_POINTS logged values per task is too short to judge and is kept. A run without
training-loss events is judged on metrics.json instead: the test loss of the untrained model (`initial_test`)
against the final one. A run with neither is kept. 5% is far below what any run that trains moves in its first
hundreds of steps and far above the drift of a run whose parameters do not move.
"""

from __future__ import annotations

import math
from typing import Optional

from mtl_bench.analysis.runs import Run
from mtl_bench.records import RunRecord

MARGIN = 0.05
MIN_POINTS = 3


SHORT = "too short to judge"


def _first_last_from_events(run: Run, tasks: list[str]) -> Optional[dict[str, tuple[float, float]] | str]:
    """{task: (first, last)} logged training loss; SHORT with too few points; None without logged losses."""
    try:
        series = run.scalars("loss/")
    except Exception:  # no events, or unreadable ones: judged from metrics.json
        return None
    if not any(series.get(f"loss/{task}") for task in tasks):
        return None
    out: dict[str, tuple[float, float]] = {}
    for task in tasks:
        points = sorted(series.get(f"loss/{task}", []))
        if len(points) < MIN_POINTS:
            return SHORT
        out[task] = (points[0][1], points[-1][1])
    return out


def _first_last_from_record(record: RunRecord, tasks: list[str]) -> Optional[dict[str, tuple[float, float]]]:
    initial, final = record.split("initial_test"), record.split("test")
    out: dict[str, tuple[float, float]] = {}
    for task in tasks:
        first, last = initial.get(task, {}).get("loss"), final.get(task, {}).get("loss")
        if not isinstance(first, (int, float)) or not isinstance(last, (int, float)):
            return None
        out[task] = (float(first), float(last))
    return out or None


def not_learned(run: Run) -> Optional[str]:
    """Why a completed run did not learn, in one line; None when it learned or cannot be judged."""
    tasks = list(run.record.split("test"))
    if not tasks:
        return None
    where, losses = "training loss", _first_last_from_events(run, tasks)
    if losses == SHORT:
        return None
    if losses is None:
        where, losses = "test loss (untrained -> final)", _first_last_from_record(run.record, tasks)
    if not isinstance(losses, dict):
        return None
    drops = [(first - last) / abs(first) for first, last in losses.values() if first != 0]
    if not drops or any(not math.isfinite(d) for d in drops):
        return None
    drop = max(drops)
    if drop >= MARGIN:
        return None
    shown = ", ".join(f"{task} {first:.4g} -> {last:.4g}" for task, (first, last) in losses.items())
    return f"no task's {where} fell by {100 * MARGIN:.0f}% (best {100 * drop:.1f}%): {shown}"
