"""Finished runs on disk: a run directory holds metrics.json (its RunRecord), checkpoints/ and the logged scalars."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from mtl_bench.config import PART_LABELS, keys_where, option_defaults
from mtl_bench.records import METRICS_FILE, RunRecord, Status

CONFIG_FILE = ".hydra/config.yaml"  # the composed config Hydra saved (interpolations such as ${seed} kept as text)

# Config keys that do not change what is trained, left out when runs are compared (a key here also covers every key
# under it): the options config.py declares with training=False (seed, labels, how often a run logs or where it
# runs), the part options that are labels, and Hydra's own settings.
NOT_TRAINING_KEYS = ("hydra", *keys_where("training", False), *PART_LABELS)


def is_training_key(key: str) -> bool:
    """False for a key in NOT_TRAINING_KEYS or under one (`hydra.run.dir`)."""
    return not any(key == k or key.startswith(k + ".") for k in NOT_TRAINING_KEYS)


def override_key(item: str) -> str:
    """The config key an override sets: `+balancer.alpha=1` -> balancer.alpha, `optim/schedule=x` -> optim.schedule."""
    return item.split("=", 1)[0].lstrip("+~").replace("/", ".")


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted key: leaf value}, in the file's order; lists are leaves."""
    if not isinstance(node, dict) or (not node and prefix):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


@dataclass
class Run:
    path: Path
    record: RunRecord

    @property
    def overrides(self) -> dict[str, str]:
        """The command-line overrides of the run as {key: value} (`seed=1` -> {"seed": "1"})."""
        return dict(item.lstrip("+~").split("=", 1) for item in self.record.overrides if "=" in item)

    @cached_property
    def config(self) -> dict[str, Any] | None:
        """The run's composed config from `.hydra/config.yaml`, or None without a readable one."""
        import yaml  # from omegaconf's dependencies; only the report needs it

        try:
            config = yaml.safe_load((self.path / CONFIG_FILE).read_text())
        except (OSError, ValueError, yaml.YAMLError):  # missing, not UTF-8, or not YAML: compare by overrides
            return None
        return config if isinstance(config, dict) else None

    @cached_property
    def choices(self) -> dict[str, str]:
        """The config-group options the run was composed from ({"balancer": "fixed", "optim/schedule": "none"}):
        from metrics.json, else from Hydra's own record of the run (a run that failed or was killed)."""
        choices: Any = self.record.choices
        if not isinstance(choices, dict):
            import yaml

            try:
                hydra = yaml.safe_load((self.path / ".hydra" / "hydra.yaml").read_text())
                choices = hydra["hydra"]["runtime"]["choices"]
            except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError):
                choices = {}
        return {str(k): str(v) for k, v in (choices or {}).items() if v is not None and not str(k).startswith("hydra/")}

    @property
    def seed(self) -> Any:
        """The run's seed (metrics.json, else the config, else the overrides); None when none says."""
        for seed in (self.record.seed, (self.config or {}).get("seed"), self.overrides.get("seed")):
            if seed is not None:
                try:
                    return int(seed)
                except (TypeError, ValueError):
                    return seed
        return None

    @property
    def time_per_step_s(self) -> float | None:
        """Seconds per optimizer step measured by the run: metrics.json's `wall_time_s` / `step`.

        wall_time_s is the training loop's wall time summed over every session of a resumed run (what ran after a
        session's last checkpoint and was redone is counted once), periodic evaluation, checkpoints and the final
        evaluation included; the evaluation before the first step is not. None when the run did not record both.
        """
        wall, step = self.record.wall_time_s, self.record.step
        if (
            isinstance(wall, bool)
            or isinstance(step, bool)
            or not isinstance(wall, (int, float))
            or not isinstance(step, int)
            or step <= 0
            or not wall >= 0
        ):
            return None
        return float(wall) / step

    def training_config(self) -> dict[str, Any] | None:
        """The flattened config without NOT_TRAINING_KEYS: what was trained. None for a run without its config.
        A run-level option that a run from an earlier version lacks counts at its default (what that version did)."""
        if self.config is None:
            return None
        config = {**option_defaults(), **flatten(self.config)}
        return {key: value for key, value in config.items() if is_training_key(key)}

    def scalars(self, prefix: str) -> dict[str, list[tuple[int, float]]]:
        """Logged scalars whose tag starts with `prefix`, as {tag: [(step, value), ...]}, whichever shipped logger
        wrote them (analysis/scalars.py)."""
        from mtl_bench.analysis.scalars import read_scalars

        return read_scalars(self.path, prefix)


def run_status(run: Run) -> Status:
    """completed | failed | diverged | interrupted | incomplete (no metrics.json yet: still running, or killed).

    Only a completed run has final metrics to average; any other status is a run to list with its reason.
    """
    return run.record.status


def run_reason(run: Run) -> str:
    """Why a run that did not complete stopped, in one line ("" for a completed run)."""
    record = run.record
    if record.completed:
        return ""
    if record.status is Status.INCOMPLETE and record.error is None:
        return "no metrics.json (killed, or still running)"
    reason = record.error or record.reason or "no reason recorded"
    step = record.step
    text = " ".join(str(reason).split())
    return f"{text} (at step {step})" if isinstance(step, int) and step > 0 and "step" not in text else text


def scan_runs(root: Path) -> list[Run]:
    """Every run under `root`, whatever its status, sorted by path.

    A run directory is one with metrics.json, or a Hydra run directory (`.hydra/overrides.yaml`) without it:
    a job that was killed or is still running. Its overrides then come from Hydra's file.
    """
    import yaml  # from omegaconf's dependencies; only the report needs it

    runs = {
        path.parent: Run(path.parent, RunRecord.read(path.parent) or RunRecord(Status.INCOMPLETE))
        for path in root.rglob(METRICS_FILE)
    }
    for overrides in root.rglob(".hydra/overrides.yaml"):
        run_dir = overrides.parent.parent
        if run_dir not in runs:
            runs[run_dir] = Run(
                run_dir, RunRecord(Status.INCOMPLETE, overrides=yaml.safe_load(overrides.read_text()) or [])
            )
    return [runs[path] for path in sorted(runs)]


def find_runs(root: Path) -> list[Run]:
    """Every completed run under `root` (a run directory or a sweep directory), sorted by path."""
    return [run for run in scan_runs(root) if run.record.completed]


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
