"""Finished runs on disk: a run directory holds metrics.json, checkpoints/ and the TensorBoard event files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.json"


@dataclass
class Run:
    path: Path
    metrics: dict[str, Any]

    @property
    def overrides(self) -> dict[str, str]:
        """The command-line overrides of the run as {key: value} (`seed=1` -> {"seed": "1"})."""
        return dict(item.lstrip("+~").split("=", 1) for item in self.metrics.get("overrides", []) if "=" in item)

    def scalars(self, prefix: str) -> dict[str, list[tuple[int, float]]]:
        """TensorBoard scalars whose tag starts with `prefix`, as {tag: [(step, value), ...]}."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(self.path), size_guidance={"scalars": 0})
        events.Reload()
        return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
                for tag in events.Tags()["scalars"] if tag.startswith(prefix)}


def _read_metrics(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return {"status": "failed", "error": f"unreadable {path.name}: {err}"}


def run_status(run: Run) -> str:
    """completed | failed | incomplete (no metrics.json yet: still running, or killed)."""
    return str(run.metrics.get("status", "incomplete"))


def scan_runs(root: Path) -> list[Run]:
    """Every run under `root`, whatever its status, sorted by path.

    A run directory is one with metrics.json, or a Hydra run directory (`.hydra/overrides.yaml`) without it:
    a job that was killed or is still running. Its overrides then come from Hydra's file.
    """
    import yaml  # from omegaconf's dependencies; only the report needs it

    runs = {path.parent: Run(path.parent, _read_metrics(path)) for path in root.rglob(METRICS_FILE)}
    for overrides in root.rglob(".hydra/overrides.yaml"):
        run_dir = overrides.parent.parent
        if run_dir not in runs:
            runs[run_dir] = Run(run_dir, {"status": "incomplete", "overrides": yaml.safe_load(overrides.read_text()) or []})
    return [runs[path] for path in sorted(runs)]


def find_runs(root: Path) -> list[Run]:
    """Every completed run under `root` (a run directory or a sweep directory), sorted by path."""
    return [run for run in scan_runs(root) if run_status(run) == "completed"]


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman rank correlation (no ties expected: ranks by sort order)."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        for rank, i in enumerate(order):
            out[i] = float(rank)
        return out

    rx, ry = ranks(x), ranks(y)
    n = len(x)
    mean = (n - 1) / 2
    cov = sum((a - mean) * (b - mean) for a, b in zip(rx, ry))
    var = sum((a - mean) ** 2 for a in rx)
    return cov / var
