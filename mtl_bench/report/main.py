"""`mtl-bench report PATH...`: read runs, group them, compute Δm, render, optionally plot."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from mtl_bench.analysis.runs import Run, scan_runs
from mtl_bench.errors import ConfigError
from mtl_bench.report.render import FORMATS, problem_line, render
from mtl_bench.report.summary import add_delta_m, describe_problems, group_runs


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


def make_report(paths: list[Path], fmt: str, baseline: Optional[str], plots: Optional[Path]) -> tuple[str, list[Path]]:
    """The rendered report and the plot files written."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: allowed: {', '.join(FORMATS)}")
    runs = collect(paths)
    groups, common = group_runs(runs)
    problems = describe_problems(runs)
    if not groups:
        shown = "; ".join(problem_line(p) for p in problems[:3]) + ("; ..." if len(problems) > 3 else "")
        raise ConfigError(f"no completed runs among {len(runs)} found: {shown}")
    if baseline:
        add_delta_m(groups, baseline)
    written: list[Path] = []
    if plots is not None:
        from mtl_bench.report.plots import write_plots

        written = write_plots(groups, plots, baseline)
    return render(groups, problems, fmt, baseline, common), written
