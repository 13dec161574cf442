"""Evaluation of every task on one split: mean loss and mean of each metric per task."""

from __future__ import annotations

import logging
from typing import Mapping

import torch

from mtl_bench.engine.data import eval_batches, task_split
from mtl_bench.models.base import MultiTaskModel
from mtl_bench.tasks.base import Splits, Task

log = logging.getLogger("mtl_bench")

Metrics = dict[str, dict[str, float]]


def log_metrics(step: int, label: str, metrics: Metrics) -> None:
    """The evaluation's line in the run's log: `step 250 val | t0: loss 0.1 acc 0.9; t1: ...`."""
    text = "; ".join(
        f"{task}: " + " ".join(f"{k} {v:.4g}" for k, v in values.items()) for task, values in metrics.items()
    )
    log.info("step %d %s | %s", step, label, text)


def loss_ratio_sum(test: Metrics, initial: Metrics) -> float:
    """The GradNorm paper's summary: sum_i L_i / L_i(0), test losses against those of the untrained model."""
    return sum(test[task]["loss"] / initial[task]["loss"] for task in test)


@torch.no_grad()
def evaluate(
    model: MultiTaskModel,
    tasks: list[Task],
    split: Splits,
    device: torch.device,
    batch_size: int = 1024,
    num_workers: int = 0,
) -> dict[str, dict[str, float]]:
    """{task: {"loss": ..., <metric>: ...}}: sums stay on the device until one transfer at the end.
    A multi-input split ({task: dataset}) evaluates each task on its own data."""
    was_training = model.training
    model.eval()
    sums: dict[str, dict[str, torch.Tensor]] = {t.name: {} for t in tasks}
    groups = [([task], split[task.name]) for task in tasks] if isinstance(split, Mapping) else [(tasks, split)]
    for group, data in groups:
        names = [task.name for task in group] if isinstance(split, Mapping) else None
        for inputs, targets in eval_batches(data, batch_size, device, num_workers):
            preds = model(inputs, tasks=names).preds
            for task in group:
                pred, target = preds[task.name], targets[task.name]
                batch_values = {"loss": task.loss(pred, target) * len(inputs), **task.metrics(pred, target)}
                for name, value in batch_values.items():
                    sums[task.name][name] = sums[task.name].get(name, 0.0) + value.detach().float()
    model.train(was_training)
    finals: dict[str, dict[str, torch.Tensor]] = {}
    for task in tasks:
        n = len(task_split(split, task.name))  # type: ignore[arg-type]
        loss = sums[task.name].pop("loss") / n
        metrics = (
            task.summarize(sums[task.name], n)
            if task.summarize is not None
            else {name: total / n for name, total in sums[task.name].items()}
        )
        finals[task.name] = {"loss": loss, **metrics}
    keys = [(task, name) for task, values in finals.items() for name in values]
    means = torch.stack([finals[t][m].reshape(()) for t, m in keys]).tolist()  # the one host sync
    result: dict[str, dict[str, float]] = {t.name: {} for t in tasks}
    for (task_name, name), value in zip(keys, means):
        result[task_name][name] = value
    return result
