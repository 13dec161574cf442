"""Choosing each row's trial on validation metrics only.

The functions here are given `ValView`s, built from a run's metrics.json without its test metrics: nothing that
selects can read test. Δm on validation is taken against the reference's validation metrics (the chosen
single-task trials', or the task set's published reference); a named metric `<task>/<metric>` is read on
validation with its direction. A single-task row's trials are ranked on their task's metrics (mean rank over
them, ties by validation loss). Runs that did not complete (failed, diverged) are never chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from mtl_bench.errors import ConfigError
from mtl_bench.report.delta_m import delta_m_flat, relative_drops
from mtl_bench.report.stats import mean_ranks

Metrics = dict[str, dict[str, float]]
LOSS = "loss"


@dataclass(frozen=True)
class ValView:
    """What selection may read of a run: its status, validation metrics and metric directions."""

    status: str
    val: Metrics
    higher_is_better: dict[str, dict[str, bool]]

    @classmethod
    def of(cls, record: Optional[Mapping[str, Any]]) -> "ValView":
        if not record:
            return cls("incomplete", {}, {})
        return cls(str(record.get("status")), dict(record.get("val") or {}), dict(record.get("higher_is_better") or {}))


def without_loss(metrics: Mapping[str, Mapping[str, float]]) -> Metrics:
    return {task: {m: v for m, v in values.items() if m != LOSS} for task, values in metrics.items()}


def cost(view: ValView, select: str, reference_val: Optional[Metrics]) -> float:
    """The selection criterion as a cost (lower is better); inf for a run that did not complete."""
    if view.status != "completed":
        return math.inf
    if select == "delta_m":
        assert reference_val is not None
        value = delta_m_flat(relative_drops(without_loss(view.val), reference_val, view.higher_is_better))
        return math.inf if math.isnan(value) else value
    task, metric = select.split("/", 1)
    if metric not in view.val.get(task, {}):
        raise ConfigError(f"select={select}: the runs have no validation metric {select}; e.g. {first_metric(view)}")
    value = view.val[task][metric]
    if math.isnan(value):
        return math.inf
    return -value if view.higher_is_better[task][metric] else value


def first_metric(view: ValView) -> str:
    for task, values in without_loss(view.val).items():
        for name in values:
            return f"{task}/{name}"
    return "<task>/<metric>"


def choose(views: list[ValView], select: str, reference_val: Optional[Metrics]) -> Optional[int]:
    """The index of the trial with the lowest cost; None when no trial completed."""
    costs = [cost(v, select, reference_val) for v in views]
    best = min(range(len(views)), key=lambda i: (costs[i], i), default=None)
    return None if best is None or math.isinf(costs[best]) else best


def choose_single_task(views: list[ValView], task: str) -> Optional[int]:
    """The trial with the best mean rank on its task's validation metrics (ties: the lower validation loss)."""
    done = [i for i, v in enumerate(views) if v.status == "completed" and task in v.val]
    if not done:
        return None
    means = [{task: without_loss(views[i].val)[task]} for i in done]
    ranks = mean_ranks(means, views[done[0]].higher_is_better)
    key = [(r if r is not None else math.inf, views[i].val[task].get(LOSS, math.inf)) for r, i in zip(ranks, done)]
    return done[min(range(len(done)), key=lambda j: key[j])]
