"""TensorBoard output of one run: tag names, the custom-scalars dashboard, hyper-parameters.

Tags (DESIGN.md): loss/<task>, weight/<task>, ratio/<task>, grad_norm/<task>, metric/<split>/<task>/<name>,
lr/<group>, perf/steps_per_s. The task is always the last path component so one regex collects all tasks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

# Families whose tags end in /<task>: each gets one chart with every task on it.
TASK_FAMILIES = ("loss", "weight", "ratio", "grad_norm")


def dashboard_layout(metric_names: Mapping[str, list[str]], splits: tuple[str, ...] = ("val", "test")) -> dict:
    """Custom-scalars layout: one multi-line chart per family and per (split, metric)."""
    per_task = {f"{family} (all tasks)": ["Multiline", [rf"^{family}/[^/]+$"]] for family in TASK_FAMILIES}
    metrics = {}
    names = sorted({name for task_metrics in metric_names.values() for name in task_metrics})
    for split in splits:
        for name in names:
            metrics[f"{split} {name} (all tasks)"] = ["Multiline", [rf"^metric/{split}/[^/]+/{name}$"]]
    return {"tasks": per_task, "metrics": metrics, "optim": {"learning rate": ["Multiline", [r"^lr/"]]}}


def flatten_hparams(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> {"optim.lr": 0.001, ...} with only the value types TensorBoard's hparams accept."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_hparams(value, prefix=f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:  # lists, None
            flat[name] = str(value)
    return flat


class RunLogger:
    """One SummaryWriter writing straight into the run directory (so TensorBoard names the run by it)."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step, flush_secs=30)

    def write_dashboard(self, metric_names: Mapping[str, list[str]]) -> None:
        self.writer.add_custom_scalars(dashboard_layout(metric_names))

    def write_hparams(self, hparam_values: Mapping[str, Any], metric_tags: list[str]) -> None:
        """Hyper-parameters go into this run's own event file (add_hparams would open a timestamped sub-run).

        The metric tags named here are ordinary scalars logged at the end of training; the HParams tab
        reads their values from this run.
        """
        experiment, start, end = hparams(dict(hparam_values), {tag: 0.0 for tag in metric_tags})
        file_writer = self.writer._get_file_writer()
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
