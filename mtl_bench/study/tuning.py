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
from typing import Mapping, Optional

from mtl_bench.analysis.criterion import criterion_cost, parse_criterion
from mtl_bench.analysis.stats import mean_ranks
from mtl_bench.errors import ConfigError
from mtl_bench.records import RunRecord, Status

Metrics = dict[str, dict[str, float]]
LOSS = "loss"


@dataclass(frozen=True)
class ValView:
    """What selection may read of a run: its status, validation metrics and metric directions."""

    status: Status
    val: Metrics
    higher_is_better: dict[str, dict[str, bool]]

    @classmethod
    def of(cls, record: Optional[RunRecord]) -> "ValView":
        """The view of a run's record: everything but its validation metrics, directions and status is left out."""
        if record is None:
            return cls(Status.INCOMPLETE, {}, {})
        return cls(record.status, dict(record.split("val")), dict(record.higher_is_better or {}))


def without_loss(metrics: Mapping[str, Mapping[str, float]]) -> Metrics:
    return {task: {m: v for m, v in values.items() if m != LOSS} for task, values in metrics.items()}


def cost(view: ValView, select: str, reference_val: Optional[Metrics]) -> float:
    """The selection criterion as a cost (lower is better); inf for a run that did not complete."""
    if view.status is not Status.COMPLETED:
        return math.inf
    if select == "delta_m":
        assert reference_val is not None
        value = criterion_cost(without_loss(view.val), parse_criterion(select), view.higher_is_better, reference_val)
        return math.inf if math.isnan(value) else value
    criterion = parse_criterion(select, "select", per_task_only=True)
    if criterion.metric not in view.val.get(criterion.task or "", {}):
        raise ConfigError(f"select={select}: the runs have no validation metric {select}; e.g. {first_metric(view)}")
    value = criterion_cost(view.val, criterion, view.higher_is_better, None)
    return math.inf if math.isnan(value) else value


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
    done = [i for i, v in enumerate(views) if v.status is Status.COMPLETED and task in v.val]
    if not done:
        return None
    means = [{task: without_loss(views[i].val)[task]} for i in done]
    ranks = mean_ranks(means, views[done[0]].higher_is_better)
    key = [(r if r is not None else math.inf, views[i].val[task].get(LOSS, math.inf)) for r, i in zip(ranks, done)]
    return done[min(range(len(done)), key=lambda j: key[j])]
