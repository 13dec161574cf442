"""The end-of-run summary: what came out of one run and where to look, printed when training ends."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Mapping

from mtl_bench.records import RunRecord
from mtl_bench.report.numbers import selection_text


def final_weights(run_dir: Path, tasks: list[str]) -> dict[str, float]:
    """The last logged `weight/<task>` of each task from the run's logged scalars ({} when none was logged)."""
    from mtl_bench.analysis.scalars import read_scalars

    try:
        series = read_scalars(run_dir, "weight/")
    except Exception:  # no events (yet), or unreadable ones: the summary says so
        return {}
    return {task: max(series[f"weight/{task}"])[1] for task in tasks if series.get(f"weight/{task}")}


def memory_text(peak: Any) -> str:
    """metrics.json's `peak_memory` as "412 MiB (CPU process peak RSS)"; "" when the run did not record it."""
    if not isinstance(peak, Mapping) or not isinstance(peak.get("bytes"), int):
        return ""
    return f"{peak['bytes'] / 2**20:.0f} MiB ({peak.get('label', peak.get('kind', '?'))})"


def format_run_summary(record: RunRecord, run_dir: Path) -> str:
    """Final test metrics per task, final loss weights, steps, wall time, the run dir and the TensorBoard command.

    `record` is what metrics.json holds for a completed run (Recipe.metrics_record); weights come from
    `record.weights` when present, else from the run's `weight/<task>` TensorBoard scalars.
    """
    test = record.split("test")
    step, wall = record.step, record.wall_time_s
    lines = []
    if isinstance(step, int) and isinstance(wall, (int, float)):
        per_step = f" ({1000 * wall / step:.3g} ms/step)" if step > 0 else ""
        lines.append(f"run finished: {step} steps in {wall:.1f} s{per_step}")
    else:
        lines.append(f"run finished ({record.status_name})")
    lines.append(f"test metrics ({selection_text(record.model_selection)}):")
    width = max((len(task) for task in test), default=0)
    for task, metrics in test.items():
        shown = "  ".join(f"{name} {value:.4g}" for name, value in metrics.items())
        lines.append(f"  {task:<{width}}  {shown}")
    weights = record.weights or final_weights(run_dir, list(test))
    if weights:
        lines.append("final loss weights: " + ", ".join(f"{task} {w:.4g}" for task, w in weights.items()))
    else:
        lines.append("final loss weights: none logged (weight/<task>)")
    memory = memory_text(record.peak_memory)
    if memory:
        lines.append(f"peak memory: {memory}")
    lines.append(f"run dir: {run_dir}")
    lines.append(f"TensorBoard: tensorboard --logdir {shlex.quote(str(run_dir))}")
    return "\n".join(lines) + "\n"
