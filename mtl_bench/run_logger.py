"""TensorBoard output of one run: tag names, the custom-scalars dashboard, hyper-parameters.

Tags: loss/<task>, weight/<task>, ratio/<task>, grad_norm/<task>, gradnorm/target/<task>,
gradnorm/loss_ratio/<task>, gradnorm/L_grad, metric/<split>/<task>/<name>, lr/<group>, perf/steps_per_s.
The task is always the last path component so one regex collects all tasks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams


def dashboard_layout(
    metric_names: Mapping[str, list[str]], train_tags: list[str], splits: tuple[str, ...] = ("val", "test")
) -> dict:
    """Custom-scalars layout: one multi-line chart per family of per-task tags and per (split, metric).

    `train_tags` are the tags the training loop logs; a tag `<family>/<task>` joins its family's chart
    (loss, weight, ratio, grad_norm, gradnorm/target, ...), any other tag gets a chart of its own.
    """
    tasks = "|".join(re.escape(task) for task in metric_names)
    families: dict[str, None] = {}  # ordered set
    singles = []
    for tag in train_tags:
        family, _, last = tag.rpartition("/")
        if last in metric_names and family:
            families[family] = None
        elif not tag.startswith(("lr/", "momentum/")):
            singles.append(tag)
    per_task = {f"{family} (all tasks)": ["Multiline", [rf"^{re.escape(family)}/({tasks})$"]] for family in families}
    metrics = {}
    names = sorted({name for task_metrics in metric_names.values() for name in task_metrics})
    for split in splits:
        for name in names:
            metrics[f"{split} {name} (all tasks)"] = ["Multiline", [rf"^metric/{split}/({tasks})/{re.escape(name)}$"]]
    optim = {"learning rate": ["Multiline", [r"^lr/"]], "momentum": ["Multiline", [r"^momentum/"]]}
    return {
        "tasks": per_task,
        "metrics": metrics,
        "optim": optim,
        "train": {tag: ["Multiline", [rf"^{re.escape(tag)}$"]] for tag in singles},
    }


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

    def write_dashboard(self, metric_names: Mapping[str, list[str]], train_tags: list[str]) -> None:
        self.writer.add_custom_scalars(dashboard_layout(metric_names, train_tags))

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
