"""Configs, models and runs built as `mtl-bench train` builds them, through the engine's public API."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Sequence

from omegaconf import DictConfig
from torch import nn

from mtl_bench.models.base import MultiTaskModel


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The run config `mtl-bench train <overrides>` composes and `train()` finalises."""
    from mtl_bench.api import compose_config
    from mtl_bench.engine.compose import finalise_config

    cfg = compose_config(overrides)
    finalise_config(cfg, list(overrides))
    return cfg


def build_taskset(cfg: DictConfig) -> Any:
    from mtl_bench.engine.builders import build
    from mtl_bench.tasks import TaskSet

    return build("tasks", cfg.tasks, TaskSet)


def build_model(cfg: DictConfig, taskset: Any) -> MultiTaskModel:
    """`cfg.model` built as the recipe builds it: input shape and heads from the task set."""
    from mtl_bench.engine.builders import build

    heads = {t.name: t.out_dim for t in taskset.tasks}
    model: MultiTaskModel = build("model", cfg.model, MultiTaskModel, input_shape=taskset.input_shape, heads=heads)
    return model


def hps_mlp(width: int, layers: int, tasks: int, head_dim: int, input_dim: int = 250) -> MultiTaskModel:
    """Hard parameter sharing MLP: `layers` Linear+ReLU of `width`, one Linear(width, head_dim) head per task
    (`t0`, `t1`, ...); the last shared layer is the trunk's last Linear."""
    modules: list[nn.Module] = []
    size = input_dim
    for _ in range(layers):
        modules += [nn.Linear(size, width), nn.ReLU()]
        size = width
    heads: dict[str, nn.Module] = {f"t{i}": nn.Linear(width, head_dim) for i in range(tasks)}
    return MultiTaskModel(nn.Sequential(*modules), heads, last_shared_layer=modules[-2])


@contextlib.contextmanager
def recipe(overrides: Sequence[str], run_dir: Path) -> Iterator[Any]:
    """The engine's run for `overrides`, set up (parts built, seeded) but not trained; cleaned up on exit."""
    from mtl_bench.engine.recipe import Recipe

    run = Recipe(compose(overrides), run_dir)
    run.setup()
    try:
        yield run
    finally:
        run.cleanup()


def recipe_step(run: Any) -> None:
    """One optimizer step of the run as its training loop takes it (no logging this step)."""
    run.optimizer_step(False)
    run.step += 1
