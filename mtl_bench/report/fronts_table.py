"""Fronts in a report: per group, the hypervolume of its front (± CI over seeds), for runs of a preference-conditioned
model (metrics.json `front`: one front per run) and for sweeps of fixed-preference runs (the classic front of separate
models: per seed, one point per run); IGD of each front against the separate-model front of the same seed, task set,
model and steps; and for a task set whose true front is known (metrics.json `true_front`) the hypervolume as a
fraction of the true front's and the IGD to the true front."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from mtl_bench.analysis.front_metrics import hypervolume, igd, non_dominated, spacing
from mtl_bench.analysis.runs import Run
from mtl_bench.analysis.stats import ci_half_width

PREFERENCE_KEYS = ("balancer.preference", "balancer.weights")  # what a fixed-preference sweep varies


@dataclass
class FrontGroup:
    """One front learner's runs (`separate` False) or one sweep of fixed-preference runs (True), per seed."""

    label: str
    separate: bool
    task_set: str
    model: str  # the model option (a front learner's: the model it wraps)
    tasks: list[str]
    reference: Optional[list[float]]
    true_front: Optional[dict[str, Any]] = None  # metrics.json `true_front` (points, hypervolume, reference_point)
    points: dict[Any, list[list[float]]] = field(default_factory=dict)  # seed -> test losses, one row per point
    steps: dict[Any, int] = field(default_factory=dict)  # seed -> optimizer steps of its run(s)
    seconds: dict[Any, float] = field(default_factory=dict)  # seed -> wall time of its run(s)
    igd: dict[Any, float] = field(default_factory=dict)  # seed -> IGD to the separate-model front

    @property
    def hypervolumes(self) -> list[float]:
        if self.reference is None:
            return []
        return [hypervolume(p, self.reference) for _, p in sorted(self.points.items(), key=lambda kv: str(kv[0]))]

    def spacings(self) -> list[float]:
        return [spacing(p) for p in self.points.values()]

    def true_hv_fractions(self) -> list[float]:
        """Each seed's hypervolume over the true front's, at the true front's reference point."""
        truth = self.true_front
        if truth is None or "hypervolume" not in truth:
            return []
        return [hypervolume(p, truth["reference_point"]) / truth["hypervolume"] for p in self.points.values()]

    def true_igds(self) -> list[float]:
        """Each seed's IGD to the true front."""
        return [] if self.true_front is None else [igd(p, self.true_front["points"]) for p in self.points.values()]


def _losses(split: dict[str, dict[str, float]], tasks: list[str]) -> list[float]:
    return [float(split[t]["loss"]) for t in tasks]


def _reference(run: Run, tasks: list[str]) -> Optional[list[float]]:
    point = ((run.config or {}).get("tasks") or {}).get("front_reference")
    if not isinstance(point, dict) or set(point) != set(tasks):
        truth = _true_front(run, tasks)  # a run without its .hydra/ config (the Python API) recorded it there
        return None if truth is None or "reference_point" not in truth else [float(v) for v in truth["reference_point"]]
    return [float(point[t]) for t in tasks]


def _true_front(run: Run, tasks: list[str]) -> Optional[dict[str, Any]]:
    truth = run.record.true_front
    if not isinstance(truth, dict) or truth.get("tasks") != tasks or not truth.get("points"):
        return None
    return truth


def front_groups(runs: list[Run]) -> list[FrontGroup]:
    """The front groups among completed runs: front-model runs grouped by their overrides but the seed; runs with a
    fixed preference grouped by their overrides but the seed and the preference (two or more points per seed).

    A group's IGD is measured against the one separate-model group of the same task set, model option and steps per
    seed (equal compute), never against fixed-preference runs trained otherwise (a study's scalarization trials)."""
    groups: dict[tuple[Any, ...], FrontGroup] = {}
    for run in runs:
        record = run.record
        if not record.completed or record.test is None:
            continue
        tasks = list(record.higher_is_better or record.test)
        overrides = {k: v for k, v in run.overrides.items() if k != "seed"}
        task_set = run.choices.get("tasks", "?")
        front = record.front
        preference = [k for k in PREFERENCE_KEYS if k in overrides]
        if front is not None:
            key: tuple[Any, ...] = ("front", task_set, tuple(sorted(overrides.items())))
            label = f"{run.choices.get('model/front', 'front')} + {run.choices.get('balancer', '?')}"
        elif preference:
            rest = {k: v for k, v in overrides.items() if k not in preference}
            key = ("separate", task_set, tuple(sorted(rest.items())))
            label = f"separate {run.choices.get('balancer', '?')} models"
        else:
            continue
        group = groups.get(key)
        if group is None:
            model = run.choices.get("model", "?")
            group = groups[key] = FrontGroup(
                label, front is None, task_set, model, tasks, _reference(run, tasks), _true_front(run, tasks)
            )
        seed = run.seed
        if front is not None:
            group.points[seed] = [_losses(m, tasks) for m in front["test"]]
        else:
            group.points.setdefault(seed, []).append(_losses(record.test, tasks))
        group.steps[seed] = group.steps.get(seed, 0) + int(record.step or 0)
        group.seconds[seed] = group.seconds.get(seed, 0.0) + float(record.wall_time_s or 0.0)
    found = [g for g in groups.values() if not g.separate or all(len(p) >= 2 for p in g.points.values())]
    _name_apart(found)
    for group in found:  # IGD against the separate-model front of the same task set, model, steps and seed
        separate = [
            s
            for s in found
            if s.separate
            and s is not group
            and (s.task_set, s.model) == (group.task_set, group.model)
            and set(s.steps.values()) == set(group.steps.values())
        ]
        if len(separate) == 1:
            for seed, points in group.points.items():
                if seed in separate[0].points:
                    group.igd[seed] = igd(points, non_dominated(separate[0].points[seed]).tolist())
    return found


def _name_apart(groups: list[FrontGroup]) -> None:
    seen: dict[str, int] = {}
    for group in groups:
        seen[group.label] = seen.get(group.label, 0) + 1
        if seen[group.label] > 1:
            group.label = f"{group.label} ({seen[group.label]})"


def _interval(values: list[float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "n/a"
    mean, half = statistics.fmean(finite), ci_half_width(finite)
    return f"{mean:.4g} ± {half:.2g}" if not math.isnan(half) else f"{mean:.4g}"


def front_table(groups: list[FrontGroup]) -> str:
    """Markdown: per task set, each group's hypervolume (mean ± 95% CI over seeds), IGD to the separate-model front,
    spacing, seeds, points per front, steps per seed (equal compute: compare the steps column); for a task set with
    a known front, also the hypervolume over the true front's and the IGD to the true front."""
    lines = []
    for task_set in sorted({g.task_set for g in groups}):
        members = [g for g in groups if g.task_set == task_set]
        reference = next((g.reference for g in members if g.reference is not None), None)
        shown = "none (set tasks.front_reference)" if reference is None else str(reference)
        known = any(g.true_front is not None for g in members)
        extra = " HV / true HV | IGD to true front |" if known else ""
        lines += [
            f"Fronts on tasks={task_set} (test losses {', '.join(members[0].tasks)}; hypervolume reference {shown}):",
            "",
            f"| group | hypervolume |{extra} IGD to separate | spacing | seeds | points | steps per seed |",
            "|---|---|---|---|---|---|---|" + ("---|---|" if known else ""),
        ]
        for g in members:
            points = sorted({len(p) for p in g.points.values()})
            steps = sorted(set(g.steps.values()))
            truth = f" {_interval(g.true_hv_fractions())} | {_interval(g.true_igds())} |" if known else ""
            lines.append(
                f"| {g.label} | {_interval(g.hypervolumes)} |{truth} {_interval(list(g.igd.values()))} | "
                f"{_interval(g.spacings())} | {len(g.points)} | {'/'.join(map(str, points))} | "
                f"{'/'.join(map(str, steps))} |"
            )
        lines.append("")
    return "\n".join(lines)


def write_front_plots(groups: list[FrontGroup], out_dir: Path) -> list[Path]:
    """fronts_<task set>.png: each group's front of its first seed (pairwise panels), the separate models' beside."""
    from mtl_bench.figures import front_figure

    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for task_set in sorted({g.task_set for g in groups}):
        members = [g for g in groups if g.task_set == task_set]
        first = {g.label: g.points[sorted(g.points, key=str)[0]] for g in members if not g.separate}
        separate = next((g for g in members if g.separate), None)
        seed = sorted(separate.points, key=str)[0] if separate else None
        figure = front_figure(
            first,
            members[0].tasks,
            separate.points[seed] if separate else None,
            title=f"tasks={task_set}: test losses, first seed of each group",
        )
        path = out_dir / f"fronts_{task_set}.png"
        figure.savefig(path, dpi=120)
        written.append(path)
        import matplotlib.pyplot as plt

        plt.close(figure)
    return written
