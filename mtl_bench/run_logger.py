"""TensorBoard output of one run: tag names, the custom-scalars dashboard, hyper-parameters.

Tags: loss/<task>, weight/<task>, grad_norm/<task>, metric/<split>/<task>/<name>, lr/<group>, perf/steps_per_s,
and each balancer's and architecture's own; docs/tensorboard.md ("Every tag") defines every one.
The task is always the last path component so one regex collects all tasks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams


def dashboard_layout(
    metric_names: Mapping[str, list[str]],
    train_tags: list[str],
    splits: tuple[str, ...] = ("val", "test"),
    task_set: str | None = None,
) -> dict:
    """Custom-scalars layout: one multi-line chart per family of per-task tags and per (split, metric).

    `train_tags` are the tags the training loop logs; a tag `<family>/<task>` joins its family's chart
    (loss, weight, ratio, grad_norm, gradnorm/target, ...), any other tag gets a chart of its own.

    TensorBoard merges the layouts of every run under one logdir by category title and appends the charts that
    differ: per-task categories are titled by the task set (`toy: tasks`), so runs of one task set share one set
    of charts and each task set gets its own, instead of repeated "loss (all tasks)" charts. Without `task_set`
    the task names stand for it.
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
    name = task_set or "+".join(metric_names)
    name = name if len(name) <= 40 else name[:37] + "..."
    return {
        f"{name}: tasks": per_task,
        f"{name}: metrics": metrics,
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


HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")  # instantiate's, not the user's


def hparam_values(config: Mapping[str, Any], choices: Mapping[str, str]) -> dict[str, Any]:
    """What the HParams tab shows: each config group's option (`balancer: gradnorm`) and the option's values
    (`balancer.alpha: 1.5`), without Hydra's instantiate keys (`_target_`, `_partial_`, ...), Hydra's own
    settings (`hydra.*`) and the task set's reference numbers (`tasks.reference.*`, read by the report only).

    `config` is the resolved run config as a plain dict; `choices` the group options ({"optim/schedule": "none"}).
    """
    values: dict[str, Any] = {g.replace("/", "."): str(o) for g, o in choices.items() if not g.startswith("hydra")}
    for key, value in flatten_hparams(config).items():
        parts = key.split(".")
        if parts[0] == "hydra" or parts[-1] in HYDRA_KEYS or key.split(".")[:2] == ["tasks", "reference"]:
            continue
        if key in values:  # a key named like a group (never expected): the option stays, the value is kept apart
            key = f"{key}.value"
        values[key] = value
    return values


class RunLogger:
    """One SummaryWriter writing straight into the run directory (so TensorBoard names the run by it)."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step, flush_secs=30)

    def write_dashboard(
        self, metric_names: Mapping[str, list[str]], train_tags: list[str], task_set: str | None = None
    ) -> None:
        self.writer.add_custom_scalars(dashboard_layout(metric_names, train_tags, task_set=task_set))

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
