"""From typed config objects (mtl_bench.config) to the objects the loop uses; the loop never reads config."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from mtl_bench.balancers import Balancer, FixedWeights, GradNorm, RescaledNormBalancer
from mtl_bench.errors import ConfigError
from mtl_bench.models import MODELS, MultiTaskModel
from mtl_bench.tasks import TASK_SETS, Task, TaskSet


def _options(conf: Any) -> dict[str, Any]:
    """The dataclass fields minus the `name` that selected it."""
    fields = asdict(conf)
    fields.pop("name")
    return fields


def build_taskset(conf: Any) -> TaskSet:
    options = _options(conf)
    reference = options.pop("reference", None)  # read by the report, not by the data
    taskset = TASK_SETS[conf.name](**options)
    check_reference(reference, taskset)
    return taskset


def check_reference(reference: dict[str, dict[str, float]] | None, taskset: TaskSet) -> None:
    """tasks.reference may name only this task set's tasks and their metrics."""
    metrics = {task.name: ["loss", *task.higher_is_better] for task in taskset.tasks}
    for task, values in (reference or {}).items():
        if task not in metrics:
            raise ConfigError(f"tasks.reference.{task}: no such task; tasks: {', '.join(metrics)}")
        for name in values:
            if name not in metrics[task]:
                raise ConfigError(f"tasks.reference.{task}.{name}: no such metric; metrics: {', '.join(metrics[task])}")


def build_model(conf: Any, taskset: TaskSet) -> MultiTaskModel:
    heads = {task.name: task.out_dim for task in taskset.tasks}
    return MODELS[conf.name](taskset.input_shape, heads, **_options(conf))


def task_weights(weights: dict[str, float] | None, task_names: list[str]) -> dict[str, float]:
    """Weights for exactly the task set's tasks: null means 1.0 each; any mismatch is a ConfigError."""
    if weights is None:
        return {name: 1.0 for name in task_names}
    unknown = sorted(set(weights) - set(task_names))
    missing = sorted(set(task_names) - set(weights))
    if unknown or missing:
        problems = []
        if unknown:
            problems.append(f"weights for unknown tasks {unknown}")
        if missing:
            problems.append(f"no weight for tasks {missing}")
        raise ConfigError(
            f"balancer.weights: {'; '.join(problems)}; weights given for {sorted(weights)}, "
            f"the task set has tasks {task_names}"
        )
    return {name: float(weights[name]) for name in task_names}


def theoretical_initial_losses(tasks: list[Task]) -> dict[str, float]:
    """Each task's known uninformed loss (GradNorm's L_i(0) option); every task must declare one."""
    unknown = [task.name for task in tasks if task.initial_loss is None]
    if unknown:
        raise ConfigError(
            f"balancer.initial_losses=theoretical: tasks {unknown} declare no theoretical initial loss "
            "(allowed here: first_step)"
        )
    return {task.name: float(task.initial_loss) for task in tasks}


def build_balancer(conf: Any, tasks: list[Task], model: MultiTaskModel) -> Balancer:
    """Build before the training forwards: GradNorm hooks the model's last shared layer."""
    names = [task.name for task in tasks]
    if conf.name == "fixed":
        return FixedWeights(task_weights(conf.weights, names))
    if conf.name == "rescaled_norm":
        options = _options(conf)
        options.pop("weights")
        return RescaledNormBalancer(task_weights(conf.weights, names), **options)
    if conf.name == "gradnorm":
        options = _options(conf)
        initial = options.pop("initial_losses")
        return GradNorm(
            names,
            shared_layer=model.last_shared_layer,
            initial_losses=theoretical_initial_losses(tasks) if initial == "theoretical" else None,
            **options,
        )
    raise ConfigError(f"balancer={conf.name!r} has no builder")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name!r} but CUDA is not available here (allowed: auto, cpu)")
    return device
