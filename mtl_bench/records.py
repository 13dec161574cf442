"""What a run directory records about its run: `metrics.json`, read and written only here as a `RunRecord`.

Torch-free: the engine writes these records; the report, the analysis and the study read them. The file is a JSON
object whose keys are RunRecord's fields (a completed run's results, or a stopped run's status and reason); a key this
version does not know is kept as it was (`extra`), and a status it does not know reads as Status.UNKNOWN with its
text kept, so an older or newer run directory reads and writes back unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Optional

from mtl_bench.errors import DivergedError, Interrupted
from mtl_bench.files import write_json

METRICS_FILE = "metrics.json"

Metrics = dict[str, dict[str, float]]  # task -> metric -> value


class Status(str, Enum):
    """How a run ended, as metrics.json says (a str: `status == "completed"` holds; str() is the value)."""

    COMPLETED = "completed"  # final metrics recorded
    FAILED = "failed"  # an error stopped it (or its metrics.json is unreadable)
    DIVERGED = "diverged"  # the non-finite policy stopped it
    INTERRUPTED = "interrupted"  # a signal stopped it; it resumes from its checkpoint
    INCOMPLETE = "incomplete"  # no metrics.json: still running, or killed
    UNKNOWN = "unknown"  # a status this version does not know (the text is kept in RunRecord.status_text)

    @classmethod
    def parse(cls, text: Any) -> "Status":
        try:
            return cls(text)
        except ValueError:
            return cls.UNKNOWN

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass
class RunRecord:
    """One run's metrics.json. Field order is the file's key order (a completed run's keys, a failure's keys)."""

    status: Status
    error: Optional[str] = None  # "<Type>: <message>" of what stopped a run
    reason: Optional[str] = None  # its first line
    step: Optional[int] = None
    wall_time_s: Optional[float] = None  # the training loop's wall time over every session of the run
    overrides: list[str] = field(default_factory=list)
    choices: Optional[dict[str, str]] = None  # the config-group options the run was composed from
    seed: Any = None
    val: Optional[Metrics] = None
    test: Optional[Metrics] = None
    summary: Optional[dict[str, float]] = None
    initial_test: Optional[Metrics] = None  # the untrained model's test metrics
    higher_is_better: Optional[dict[str, dict[str, bool]]] = None
    model_selection: Optional[dict[str, Any]] = None
    implementations: Optional[dict[str, Any]] = None
    reference: Optional[dict[str, dict[str, float]]] = None  # the task set's reference numbers
    front: Optional[dict[str, Any]] = None  # trainer.front.rays: the learned front
    true_front: Optional[dict[str, Any]] = None  # a task set with a known front
    peak_memory: Optional[dict[str, Any]] = None  # {"bytes", "label"}
    threads: Optional[int] = None
    device: Optional[str] = None
    finished_at: Optional[str] = None
    weights: Optional[dict[str, float]] = None  # final loss weights, where a record carries them
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept for writing back
    status_text: Optional[str] = None  # the file's status when it is not a Status (Status.UNKNOWN)
    # The known keys the file had (a null value kept as null); None: a record built here, which writes the keys a
    # completed run writes (COMPLETED_KEYS) and every other field that is set.
    keys: Optional[tuple[str, ...]] = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunRecord":
        known = {f.name for f in dataclasses.fields(cls)} - {"extra", "status_text", "keys"}
        values = {k: v for k, v in data.items() if k in known}
        text = data.get("status", Status.INCOMPLETE.value)
        status = Status.parse(text)
        values["status"] = status
        if values.get("overrides") is None:
            values["overrides"] = []
        return cls(
            **values,
            extra={k: v for k, v in data.items() if k not in known},
            status_text=None if status is not Status.UNKNOWN else str(text),
            keys=tuple(k for k in data if k in known),
        )

    @classmethod
    def read(cls, run_dir: Path) -> Optional["RunRecord"]:
        """The run's record; None without metrics.json; a failed record naming the problem when it is unreadable."""
        path = run_dir / METRICS_FILE
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            return cls(Status.FAILED, error=f"unreadable {path.name}: {err}")
        if not isinstance(data, dict):
            return cls(Status.FAILED, error=f"unreadable {path.name}: not a JSON object")
        return cls.from_dict(data)

    # ------------------------------------------------------------------ writing

    def to_dict(self) -> dict[str, Any]:
        keys = COMPLETED_KEYS if self.keys is None and self.status is Status.COMPLETED else (self.keys or ())
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("extra", "status_text", "keys"):
                continue
            value = getattr(self, f.name)
            if f.name == "status":
                out["status"] = self.status_text if self.status is Status.UNKNOWN and self.status_text else str(value)
            elif f.name in keys or (value is not None and value != []):
                out[f.name] = value
        return {**out, **self.extra}

    def write(self, run_dir: Path) -> Path:
        """metrics.json, written atomically; its path."""
        write_json(run_dir / METRICS_FILE, self.to_dict())
        return run_dir / METRICS_FILE

    # ------------------------------------------------------------------ what readers ask

    @property
    def completed(self) -> bool:
        return self.status is Status.COMPLETED

    @property
    def finished(self) -> bool:
        """An outcome a rerun keeps (completed, or diverged: training it again diverges again)."""
        return self.status in (Status.COMPLETED, Status.DIVERGED)

    @property
    def status_name(self) -> str:
        """The status as the file says it (an unknown status as its text)."""
        return self.status_text if self.status is Status.UNKNOWN and self.status_text else self.status.value

    def split(self, name: str) -> Metrics:
        """The `val`, `test` or `initial_test` metrics ({} when not recorded)."""
        if name not in ("val", "test", "initial_test"):
            raise ValueError(f"split must be val, test or initial_test, got {name!r}")
        return getattr(self, name) or {}


# What a completed run's metrics.json always holds (a null where the run has no value), in the file's order; `front`
# and `true_front` are written when there is one.
COMPLETED_KEYS = (
    "status",
    "step",
    "wall_time_s",
    "overrides",
    "choices",
    "seed",
    "val",
    "test",
    "summary",
    "initial_test",
    "higher_is_better",
    "model_selection",
    "implementations",
    "reference",
    "peak_memory",
    "threads",
    "device",
    "finished_at",
)


def previous_status(run_dir: Path) -> Optional[Status]:
    """The status metrics.json records (completed, failed, diverged, interrupted), or None if there is none."""
    try:
        data = json.loads((run_dir / METRICS_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "status" not in data:
        return None
    return Status.parse(data["status"])


def record_failure(run_dir: Path, err: BaseException, step: int, overrides: list[str], choices: dict[str, str]) -> None:
    """metrics.json with status "failed" (or "diverged", "interrupted"), so a sweep's report lists the run with
    its reason; a finished run's results stay."""
    if not run_dir.is_dir() or previous_status(run_dir) is Status.COMPLETED:
        return
    interrupted = isinstance(err, (Interrupted, KeyboardInterrupt))
    status = Status.DIVERGED if isinstance(err, DivergedError) else Status.INTERRUPTED if interrupted else Status.FAILED
    RunRecord(
        status,
        error=f"{type(err).__name__}: {err}",
        reason=str(err).splitlines()[0] if str(err) else type(err).__name__,
        step=step,
        overrides=overrides,
        choices=choices,
        keys=("status", "error", "reason", "step", "overrides", "choices"),
    ).write(run_dir)
