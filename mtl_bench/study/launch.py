"""Run a list of planned runs through the configured Hydra launcher (basic, joblib, submitit, ...), as `mtl-bench
train -m` would: each run is one job of the launcher, with its own overrides and `hydra.sweep.subdir` (its id),
so every run is an ordinary run directory under <study>/runs/ with its .hydra/, train.log and metrics.json."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, open_dict

from mtl_bench.errors import ConfigError
from mtl_bench.study.plan import PlannedRun

# The runs log to their own train.log only: the study prints one line per run.
# Hydra's `disabled` hydra_logging would also disable every logger that exists (dictConfig's default): not here.
QUIET = [
    "hydra/hydra_logging=disabled",
    "hydra.hydra_logging.disable_existing_loggers=false",
    "hydra.job_logging.root.handlers=[file]",
]
# What `-m` sets: the jobs know they are part of a sweep (no end-of-run summary each, failures recorded).
MULTIRUN = ["hydra.mode=MULTIRUN"]


def study_job(cfg: DictConfig) -> Any:
    """The task function of every job (module level, so joblib and submitit can pickle it by name)."""
    from hydra.core.hydra_config import HydraConfig

    from mtl_bench.train import run_experiment

    hydra = HydraConfig.get()
    name = hydra.job.override_dirname if not hydra.sweep.subdir else hydra.sweep.subdir
    started = time.perf_counter()
    try:
        run_experiment(cfg)
    except ConfigError as err:  # recorded in the run's metrics.json; the study goes on with the other runs
        print(f"study: {name}: failed: {err}", file=sys.stderr, flush=True)
        return None
    print(f"study: {name}: done in {time.perf_counter() - started:.1f} s", flush=True)
    return None


def compose_base(overrides: list[str]) -> Any:
    """Compose `config` in multirun mode inside an initialised GlobalHydra; returns (hydra, cfg)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    hydra = GlobalHydra.instance().hydra
    assert hydra is not None
    cfg = hydra.compose_config(
        config_name="config", overrides=overrides, run_mode=RunMode.MULTIRUN, with_log_configuration=False
    )
    return hydra, cfg


def hydra_session() -> Any:
    """A GlobalHydra on mtl-bench's configs (the job name `train`: run logs are train.log, as for train)."""
    from hydra import initialize_config_dir

    import mtl_bench.train  # noqa: F401  (registers the schemas and resolvers `mtl-bench train` composes with)
    from mtl_bench.catalog import conf_root

    return initialize_config_dir(config_dir=str(conf_root()), version_base="1.3", job_name="train")


def task_names(experiment: list[str]) -> list[str]:
    """The experiment's task names, from its task set built once (a study YAML may list them instead: `tasks`)."""
    from mtl_bench.engine.builders import build

    with hydra_session():
        _, cfg = compose_base(list(experiment))
        taskset = build("tasks", cfg.tasks)  # without the keys the engine reads itself (tasks.front_reference)
    return [t.name for t in taskset.tasks]


def check_composes(launcher: list[str], runs: list[list[str]]) -> None:
    """Compose the launcher's config and each of `runs` (overrides) as its job would be; Hydra's errors name a bad
    option or key, the engine's config check a bad value."""
    from mtl_bench.engine.compose import finalise_config

    with hydra_session():
        hydra, cfg = compose_base([*MULTIRUN, *QUIET, *launcher])
        for overrides in runs:
            job = hydra.config_loader.load_sweep_config(cfg, overrides)
            with open_dict(job):
                del job["hydra"]  # the run's own config, as the task function gets it
            finalise_config(job, overrides)


def launch(runs: Sequence[PlannedRun], runs_dir: Path, launcher: list[str], resume: set[str]) -> None:
    """Run `runs` as one batch of jobs of the launcher that `launcher` (hydra overrides) configures; runs whose id
    is in `resume` continue from their checkpoint (trainer.resume=auto)."""
    from hydra._internal.callbacks import Callbacks  # what Hydra.multirun builds for its sweeper
    from hydra.core.plugins import Plugins
    from hydra.core.utils import JobReturn
    from hydra.types import HydraContext

    if not runs:
        return
    jobs = [
        [
            *run.overrides,
            *(["trainer.resume=auto"] if run.id in resume else []),
            f"hydra.sweep.subdir={run.id}",
        ]
        for run in runs
    ]
    with hydra_session():
        hydra, cfg = compose_base([f"hydra.sweep.dir={runs_dir.resolve()}", *MULTIRUN, *QUIET, *launcher])
        context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(cfg))
        plugin = Plugins.instance().instantiate_launcher(hydra_context=context, task_function=study_job, config=cfg)
        returns: Sequence[JobReturn] = plugin.launch(jobs, initial_job_idx=0)
    del returns  # each run's outcome is its metrics.json
