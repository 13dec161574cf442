"""What a run directory records about its run: `metrics.json`, its one file name, and the failure record.

Torch-free: the engine writes these records and the report reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

from mtl_bench.errors import DivergedError, Interrupted
from mtl_bench.files import write_json

METRICS_FILE = "metrics.json"


def previous_status(run_dir: Path) -> str | None:
    """The status metrics.json records (completed, failed, diverged, interrupted), or None if there is none."""
    try:
        return json.loads((run_dir / METRICS_FILE).read_text()).get("status")
    except (OSError, ValueError):
        return None


def record_failure(run_dir: Path, err: BaseException, step: int, overrides: list[str], choices: dict[str, str]) -> None:
    """metrics.json with status "failed" (or "diverged", "interrupted"), so a sweep's report lists the run with
    its reason; a finished run's results stay."""
    if not run_dir.is_dir() or previous_status(run_dir) == "completed":
        return
    interrupted = isinstance(err, (Interrupted, KeyboardInterrupt))
    status = "diverged" if isinstance(err, DivergedError) else "interrupted" if interrupted else "failed"
    write_json(
        run_dir / METRICS_FILE,
        {
            "status": status,
            "error": f"{type(err).__name__}: {err}",
            "reason": str(err).splitlines()[0] if str(err) else type(err).__name__,
            "step": step,
            "overrides": overrides,
            "choices": choices,
        },
    )
