"""`logger=tensorboard`: TensorBoard event files in the run directory, a custom-scalars dashboard, hyper-parameters.

Tags: loss/<task>, weight/<task>, grad_norm/<task>, metric/<split>/<task>/<name>, lr/<group>, perf/steps_per_s,
and each balancer's and architecture's own; docs/tensorboard.md ("Every tag") defines every one.
The task is always the last path component so one regex collects all tasks.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summary

from mtl_bench.loggers.base import Logger, RunInfo


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


class TensorBoardLogger(Logger):
    """One SummaryWriter writing straight into the run directory (so TensorBoard names the run by it)."""

    def __init__(self, run: RunInfo, flush_secs: int = 30) -> None:
        """run: the run's facts (given by the engine); flush_secs: how often the writer flushes its events to disk by
        itself, in seconds (> 0)."""
        if flush_secs <= 0:
            raise ValueError(f"flush_secs: must be > 0, got {flush_secs}")
        self.run = run
        self.writer = SummaryWriter(log_dir=str(run.dir), purge_step=run.resume_step or None, flush_secs=flush_secs)
        self.layout_written = False

    def log_hparams(self, hparams: Mapping[str, Any], metric_tags: Sequence[str]) -> None:
        """Hyper-parameters go into this run's own event file (add_hparams would open a timestamped sub-run).

        The metric tags named here are ordinary scalars logged at the end of training; the HParams tab
        reads their values from this run.
        """
        experiment, start, end = hparams_summary(dict(hparams), {tag: 0.0 for tag in metric_tags})
        file_writer = self.writer._get_file_writer()
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        train_tags = [tag for tag in scalars if not tag.startswith("metric/")]
        if not self.layout_written and train_tags:  # the tags are known only now (they depend on the balancer)
            names = {task: list(names) for task, names in self.run.metric_names.items()}
            self.writer.add_custom_scalars(dashboard_layout(names, train_tags, task_set=self.run.task_set))
            self.layout_written = True
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def log_image(self, tag: str, image: np.ndarray, step: int) -> None:
        self.writer.add_image(tag, image, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
