"""Runs grouped by their overrides minus the seed: mean ± std over seeds of every final test metric, and Δm."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from mtl_bench.analysis.runs import Run, run_status
from mtl_bench.errors import ConfigError
from mtl_bench.report.delta_m import delta_m_flat, delta_m_task_averaged, relative_drops

SEED_KEYS = ("seed",)
LOSS = "loss"  # reported by every task; Δm and the table use the task metrics (mse, accuracy, ...)


def varied_overrides(run: Run) -> list[str]:
    """The run's command-line overrides without the seed, sorted: what names its group."""
    return sorted(item for item in run.metrics.get("overrides", []) if item.split("=", 1)[0].lstrip("+~") not in SEED_KEYS)


def settings(run: Run) -> dict[str, str]:
    """Every config-group choice of the run plus its other overrides (seed excluded): what a baseline is matched on."""
    values = {str(k): str(v) for k, v in run.metrics.get("choices", {}).items()}
    values.update({k: v for k, v in run.overrides.items() if k not in SEED_KEYS})
    return values


@dataclass
class Stat:
    mean: float
    std: float  # sample standard deviation over seeds; nan with one seed
    n: int


@dataclass
class Group:
    label: str  # the overrides that tell this group from the others (see group_runs)
    settings: dict[str, str]
    runs: list[Run]
    stats: dict[str, dict[str, Stat]] = field(default_factory=dict)  # task -> metric -> Stat
    higher_is_better: dict[str, dict[str, bool]] = field(default_factory=dict)
    delta_m: Optional[dict[str, float]] = None  # {"flat": ..., "task_averaged": ...} against the baseline
    baseline_label: Optional[str] = None

    @property
    def means(self) -> dict[str, dict[str, float]]:
        return {task: {name: s.mean for name, s in metrics.items()} for task, metrics in self.stats.items()}


def summarise(runs: list[Run]) -> Group | None:
    completed = [r for r in runs if run_status(r) == "completed"]
    if not completed:
        return None
    first = completed[0]
    stats: dict[str, dict[str, Stat]] = {}
    for task, metrics in first.metrics["test"].items():
        for name in metrics:
            if name == LOSS and len(metrics) > 1:
                continue
            values = [r.metrics["test"][task][name] for r in completed if name in r.metrics["test"].get(task, {})]
            std = statistics.stdev(values) if len(values) > 1 else math.nan
            stats.setdefault(task, {})[name] = Stat(statistics.fmean(values), std, len(values))
    return Group(" ".join(varied_overrides(first)) or "(defaults)", settings(first), completed, stats, first.metrics.get("higher_is_better", {}))


def group_runs(runs: list[Run]) -> tuple[list[Group], list[str]]:
    """Completed runs grouped by overrides minus the seed, in the order their first run was found.

    Returns the groups, labelled by the overrides that differ between them, and the overrides all share.
    """
    buckets: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        if run_status(run) == "completed":
            buckets.setdefault(tuple(varied_overrides(run)), []).append(run)
    groups = [g for g in (summarise(rs) for rs in buckets.values()) if g is not None]
    keys = list(buckets)
    common = [item for item in keys[0] if all(item in key for key in keys[1:])] if len(keys) > 1 else []
    for group, key in zip(groups, keys):
        group.label = " ".join(item for item in key if item not in common) or "(defaults)"
    return groups, common


def by_task_set(groups: list[Group]) -> dict[str, list[Group]]:
    """Groups split by the task set they trained on (one table and one set of plots each)."""
    parts: dict[str, list[Group]] = {}
    for group in groups:
        parts.setdefault(group.settings.get("tasks", "+".join(group.stats)), []).append(group)
    return parts


def parse_baseline(text: str) -> dict[str, str]:
    """`balancer=fixed` (or several, space or comma separated) -> {"balancer": "fixed"}; `reference` -> {}."""
    if text == "reference":
        return {}
    pairs = [item for item in text.replace(",", " ").split() if item]
    if not pairs or not all("=" in item for item in pairs):
        raise ConfigError(f"--baseline {text!r}: expected key=value (e.g. balancer=fixed) or 'reference'")
    return dict(item.split("=", 1) for item in pairs)


def _without(values: dict[str, str], keys: list[str]) -> dict[str, str]:
    """Drop the selected keys and everything under them (`balancer` drops `balancer.alpha` too)."""
    return {k: v for k, v in values.items() if not any(k == key or k.startswith(key + ".") for key in keys)}


def find_baseline(group: Group, groups: list[Group], selector: dict[str, str]) -> Group | None:
    """The group that differs from `group` only in the selected keys, which it has at the selected values."""
    keys = list(selector)
    wanted = _without(group.settings, keys)
    for candidate in groups:
        if all(candidate.settings.get(k) == v for k, v in selector.items()) and \
                _without(candidate.settings, keys) == wanted:
            return candidate
    return None


def add_delta_m(groups: list[Group], baseline: str) -> None:
    """Fill each group's Δm against its baseline group, or against the task set's reference values."""
    selector = parse_baseline(baseline)
    matched = False
    for group in groups:
        if not selector:  # single-task reference values from the task set's config
            reference = group.runs[0].metrics.get("reference")
            if not reference:
                continue
            base_means, group.baseline_label = reference, "reference"
        else:
            base = find_baseline(group, groups, selector)
            if base is None:
                continue
            base_means, group.baseline_label = base.means, base.label
        drops = relative_drops(group.means, base_means, group.higher_is_better)
        group.delta_m = {"flat": delta_m_flat(drops), "task_averaged": delta_m_task_averaged(drops)}
        matched = True
    if not matched:
        what = "reference values (tasks.reference)" if not selector else f"a group with {baseline}"
        raise ConfigError(f"--baseline {baseline}: no run has {what} to compare with")


def describe_problems(runs: list[Run]) -> list[dict[str, Any]]:
    """Failed and incomplete runs, so the report lists them instead of dropping them."""
    return [{"path": str(r.path), "status": run_status(r), "error": r.metrics.get("error", ""),
             "overrides": " ".join(varied_overrides(r))}
            for r in runs if run_status(r) != "completed"]
