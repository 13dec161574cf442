"""A selection criterion, its one grammar and its cost: what a run's model selection (`select.criterion`), a
validation-stepped schedule (`optim.schedule.criterion`) and a study's tuning (`select=`) choose by.

    delta_m            Δm on validation against a reference (analysis/delta_m.py, flat convention)
    <task>/<metric>    one task's metric, signed by its direction
    <metric>           the metric's mean over the tasks that have it, each signed by its direction (not in a study,
                       which compares trials task by task)

A criterion is a cost: lower is better.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from mtl_bench.analysis.delta_m import delta_m_flat, relative_drops
from mtl_bench.errors import ConfigError

DELTA_M = "delta_m"
Metrics = Mapping[str, Mapping[str, float]]
HigherIsBetter = Mapping[str, Mapping[str, bool]]


@dataclass(frozen=True)
class Criterion:
    text: str
    metric: Optional[str] = None  # None: delta_m
    task: Optional[str] = None  # None with a metric: its mean over the tasks that have it


def parse_criterion(text: str, key: str = "select", *, per_task_only: bool = False) -> Criterion:
    """The criterion `text` names; `per_task_only` refuses a bare <metric> (and a task name with a slash), naming
    `key` in one line."""
    if text == DELTA_M:
        return Criterion(text)
    task, _, metric = text.rpartition("/")
    if per_task_only and not (task and metric and "/" not in task):
        raise ConfigError(f"{key}={text}: allowed: {DELTA_M} or <task>/<metric>")
    return Criterion(text, metric, task or None)


def criterion_tasks(criterion: Criterion, higher_is_better: HigherIsBetter) -> list[str]:
    """The tasks a metric criterion reads: its task, or every task that has the metric."""
    if criterion.task is not None:
        return [criterion.task]
    return [t for t in higher_is_better if criterion.metric in higher_is_better[t]]


def criterion_cost(
    val: Metrics, criterion: Criterion, higher_is_better: HigherIsBetter, reference: Optional[Metrics]
) -> float:
    """The criterion on `val` as a cost (lower is better; nan where Δm has no metric to compare)."""
    if criterion.metric is None:
        return delta_m_flat(relative_drops(val, reference or {}, higher_is_better))
    metric = criterion.metric
    values = [
        val[t][metric] * (-1.0 if higher_is_better[t][metric] else 1.0)
        for t in criterion_tasks(criterion, higher_is_better)
    ]
    return sum(values) / len(values)


def score(
    val: Metrics, criterion: str, higher_is_better: HigherIsBetter, reference: Optional[Metrics], key: str
) -> float:
    """`criterion` on `val` as a cost, checked against the task set: delta_m needs `reference`, a metric must be
    one of `higher_is_better`'s; `key` names the setting in errors (the engine's select.criterion and
    optim.schedule.criterion)."""
    parsed = parse_criterion(criterion, key)
    if parsed.metric is None:
        if not reference:
            raise ConfigError(
                f"{key}=delta_m needs tasks.reference (single-task numbers); choose a metric instead, e.g. {key}=loss"
            )
        return criterion_cost(val, parsed, higher_is_better, reference)
    tasks = criterion_tasks(parsed, higher_is_better)
    known = {m for names in higher_is_better.values() for m in names}
    if not tasks or any(parsed.metric not in higher_is_better.get(t, {}) for t in tasks):
        raise ConfigError(
            f"{key}={criterion!r}: allowed: delta_m, a metric ({', '.join(sorted(known))})"
            f" or <task>/<metric> with a task of {', '.join(higher_is_better)}"
        )
    return criterion_cost(val, parsed, higher_is_better, reference)
