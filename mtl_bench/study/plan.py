"""Every run of a study, by id: the tuning trials (seed `tune_seed`) of each method, of the two built-in baselines
and of each task's single-task baseline, then the final runs (the selected trial of each, one run per seed).

A run is an ordinary `mtl-bench train` run: its overrides are the study's `experiment` followed by the row's
settings and the seed. Run ids are paths under the study's runs/ directory: tune/<row>/t03, final/<row>/s1, where a
row is a method, `equal`, `scalarization` or `single_task-<task>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
from omegaconf import DictConfig

from mtl_bench.errors import ConfigError
from mtl_bench.report.summary import format_value
from mtl_bench.study.space import latin_hypercube, scalarization_weights, stream_seed
from mtl_bench.study.spec import EQUAL, SCALARIZATION, SINGLE_TASK, plain

TUNE, FINAL = "tune", "final"


@dataclass(frozen=True)
class PlannedRun:
    id: str
    phase: str  # tune | final
    row: str  # the table row it belongs to: a method, equal, scalarization, single_task-<task>
    seed: int
    settings: dict[str, Any]  # what the row sets: balancer option, fixed keys, the trial's tuned values
    overrides: list[str] = field(default_factory=list)
    trial: Optional[int] = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "phase": self.phase,
            "row": self.row,
            "seed": self.seed,
            "trial": self.trial,
            "settings": self.settings,
            "overrides": self.overrides,
        }


def single_task_row(task: str) -> str:
    return f"{SINGLE_TASK}-{task}"


def overrides_of(experiment: list[str], settings: dict[str, Any], seed: int) -> list[str]:
    return [*experiment, *(f"{key}={format_value(value)}" for key, value in settings.items()), f"seed={seed}"]


def check_experiment(cfg: DictConfig) -> None:
    """The study sets the balancer, the seed and the tuned keys itself: the experiment must leave them."""
    owned = {"balancer", "seed", "trainer.only_tasks", *cfg.space}
    for item in cfg.experiment:
        key = item.split("=", 1)[0].lstrip("+~").replace("/", ".")
        if key in owned or key.startswith("balancer."):
            raise ConfigError(f"experiment: {item} is set by the study (methods, space or seeds); leave it out")


def rows_settings(cfg: DictConfig, tasks: list[str]) -> dict[str, dict[str, Any]]:
    """Each row's fixed settings (before its trial's values)."""
    rows: dict[str, dict[str, Any]] = {}
    if cfg.reference == "single_task":
        for task in tasks:
            rows[single_task_row(task)] = {"balancer": "fixed", "trainer.only_tasks": [task]}
    rows[EQUAL] = {"balancer": "fixed"}
    rows[SCALARIZATION] = {"balancer": "fixed"}
    for name, method in cfg.methods.items():
        rows[name] = {"balancer": method.balancer, **plain(method["keys"])}
    return rows


def trials(cfg: DictConfig, tasks: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each row's `budget` trials. The shared space's points are drawn once and given to every row in the same order
    (common random numbers: trial i of every row has the same learning rate, so rows differ by their method only);
    a method's own space and scalarization's weights are drawn from the row's own stream."""
    if len(tasks) < 2:
        raise ConfigError(f"tasks={tasks}: a study compares multi-task methods: it needs two or more tasks")
    shared = latin_hypercube(plain(cfg.space), cfg.budget, np.random.default_rng(stream_seed(cfg.sampler_seed, "")))
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows_settings(cfg, tasks):
        rng = np.random.default_rng(stream_seed(cfg.sampler_seed, row))
        own = latin_hypercube(plain(cfg.methods[row].space) if row in cfg.methods else {}, cfg.budget, rng)
        points = [{**common, **mine} for common, mine in zip(shared, own)]
        if row == SCALARIZATION:
            weights = cfg.scalarization
            for point, w in zip(points, scalarization_weights(tasks, cfg.budget, rng, weights.weights, weights.range)):
                point["balancer.weights"] = w
        out[row] = points
    return out


def tuning_runs(cfg: DictConfig, tasks: list[str]) -> list[PlannedRun]:
    check_experiment(cfg)
    experiment = list(cfg.experiment)
    fixed = rows_settings(cfg, tasks)
    runs = []
    for row, points in trials(cfg, tasks).items():
        for i, point in enumerate(points):
            settings = {**fixed[row], **point}
            runs.append(
                PlannedRun(
                    id=f"{TUNE}/{row}/t{i:02d}",
                    phase=TUNE,
                    row=row,
                    seed=cfg.tune_seed,
                    settings=settings,
                    overrides=overrides_of(experiment, settings, cfg.tune_seed),
                    trial=i,
                )
            )
    return runs


def final_runs(cfg: DictConfig, chosen: dict[str, PlannedRun]) -> list[PlannedRun]:
    """The chosen trial of each row, once per final seed."""
    experiment = list(cfg.experiment)
    return [
        PlannedRun(
            id=f"{FINAL}/{row}/s{seed}",
            phase=FINAL,
            row=row,
            seed=seed,
            settings=run.settings,
            overrides=overrides_of(experiment, run.settings, seed),
            trial=run.trial,
        )
        for row, run in chosen.items()
        for seed in cfg.seeds
    ]
