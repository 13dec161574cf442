"""`mtl-bench report PATH...`: read runs, group them, compute Δm, render, optionally plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from mtl_bench.analysis.runs import Run, scan_runs
from mtl_bench.errors import ConfigError
from mtl_bench.report.render import FORMATS, problem_line, render
from mtl_bench.report.summary import add_delta_m, by_task_set, describe_problems, group_runs, set_delta_m


def collect(paths: list[Path]) -> list[Run]:
    runs: dict[Path, Run] = {}
    for path in paths:
        if not path.exists():
            raise ConfigError(f"{path} does not exist")
        found = scan_runs(path)
        if not found:
            raise ConfigError(f"no runs under {path} (a run directory holds metrics.json or .hydra/overrides.yaml)")
        runs.update({run.path.resolve(): run for run in found})  # the same run given twice counts once
    return list(runs.values())


def split_not_learned(runs: list[Run]) -> tuple[list[Run], list[dict[str, Any]]]:
    """The runs to rank, and the completed runs that did not learn (analysis/learning.py) as problems."""
    from mtl_bench.analysis.learning import not_learned
    from mtl_bench.report.summary import varied_overrides

    kept, flagged = [], []
    for run in runs:
        reason = not_learned(run) if run.record.completed else None
        if reason is None:
            kept.append(run)
        else:
            flagged.append(
                {
                    "path": str(run.path),
                    "status": "did not learn",
                    "reason": reason,
                    "overrides": " ".join(varied_overrides(run)),
                }
            )
    return kept, flagged


def make_report(
    paths: list[Path],
    fmt: str,
    baseline: Optional[str],
    plots: Optional[Path],
    *,
    wide: bool = False,
    published: Optional[str] = None,
) -> tuple[str, list[Path]]:
    """The rendered report and the plot files written."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: allowed: {', '.join(FORMATS)}")
    if published and baseline:
        raise ConfigError("--published: Δm is taken against the paper's single-task row; leave out --baseline")
    multi_task: list[Run] = []
    references: list[Run] = []
    for run in collect(paths):
        (references if trains_a_subset(run) else multi_task).append(run)
    runs, unlearned = split_not_learned(multi_task)
    if not runs and references:  # only single-task runs: compare them among themselves
        runs, references = references, []
    groups, common = group_runs(runs)
    problems = unlearned + describe_problems(runs)
    if not groups and not unlearned:
        shown = "; ".join(problem_line(p) for p in problems[:3]) + ("; ..." if len(problems) > 3 else "")
        raise ConfigError(f"no completed runs among {len(runs)} found: {shown}")
    if not groups:  # runs completed but none learned: the report is the list of them (not an error)
        return render(groups, problems, fmt, baseline, common, wide=wide), []
    tables = None
    if published:
        from mtl_bench.report.published import load

        every = load(published)
        tables = {tasks: every[tasks] for tasks in by_task_set(groups) if tasks in every}
        if not tables:
            raise ConfigError(
                f"--published {published}: no table for the task sets here ({', '.join(by_task_set(groups))}); "
                f"it has {', '.join(every)}"
            )
        for tasks, table in tables.items():
            for group in by_task_set(groups)[tasks]:
                if table.stl:
                    set_delta_m(group, table.stl, f"{published} single-task row")
    if baseline:
        add_delta_m(groups, baseline)
    written: list[Path] = []
    if plots is not None:
        from mtl_bench.report.plots import write_plots

        written = write_plots(groups, plots, baseline)
    text = render(groups, problems, fmt, baseline, common, wide=wide, published=tables)
    fronts, front_written = front_section(runs, fmt, plots)
    return text + reference_section(references, fmt) + fronts, written + front_written


def trains_a_subset(run: Run) -> bool:
    """A run restricted to some of its task set's tasks (`trainer.only_tasks`: a single-task reference)."""
    config = run.config
    if config is not None:
        return bool((config.get("trainer") or {}).get("only_tasks"))
    return any(item.lstrip("+").startswith("trainer.only_tasks=") for item in run.record.overrides)


def reference_section(references: list[Run], fmt: str) -> str:
    """Single-task runs, listed apart: each group's test metrics (mean over seeds), never ranked among the
    multi-task groups (a run with one task's metrics would otherwise rank first on them)."""
    groups, _ = group_runs(references)
    if not groups or fmt not in ("table", "markdown"):
        return ""
    lines = ["single-task references (trainer.only_tasks; not ranked with the groups above):"]
    for group in groups:
        metrics = ", ".join(
            f"{task}/{name} {stat.mean:.4g}" for task, values in group.stats.items() for name, stat in values.items()
        )
        lines.append(f"  {group.label} ({group.count} seed{'s' if group.count != '1' else ''}): {metrics}")
    bullet = "- " if fmt == "markdown" else ""
    return "\n" + "\n".join(bullet + line for line in lines) + "\n"


def front_section(runs: list[Run], fmt: str, plots: Optional[Path]) -> tuple[str, list[Path]]:
    """The fronts' hypervolume table (report/fronts_table.py) after a table or markdown report, and their plots."""
    if not any(run.record.front is not None for run in runs) and not any(
        k.startswith(("balancer.preference", "balancer.weights")) for run in runs for k in run.overrides
    ):
        return "", []
    from mtl_bench.report.fronts_table import front_groups, front_table, write_front_plots

    groups = front_groups(runs)
    if not groups:
        return "", []
    written = write_front_plots(groups, plots) if plots is not None else []
    return ("\n" + front_table(groups) if fmt in ("table", "markdown") else ""), written


def sweep_summary(sweep_dir: Path) -> str:
    """The compact report of a sweep's runs (what `mtl-bench report SWEEP_DIR` prints), or one line saying why
    there is none; never raises for a sweep that produced nothing to report."""
    try:
        text, _ = make_report([sweep_dir], "table", None, None)
    except ConfigError as err:
        return f"no report for {sweep_dir}: {err}\n"
    return f"{text}full report: mtl-bench report {sweep_dir} --baseline KEY=VALUE (Δm and its 95% CI)\n"
