"""One experiment from a composed config: build everything, train, write metrics.json."""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from mtl_bench.config import RunConf
from mtl_bench.engine.builders import build_balancer, build_model, build_taskset, pick_device
from mtl_bench.engine.checkpoint import find_checkpoint, load_checkpoint
from mtl_bench.engine.distributed import (broadcast_text, init_distributed, rank_device, shutdown_distributed,
                                          wrap_ddp)
from mtl_bench.engine.files import write_json
from mtl_bench.engine.precision import build_precision
from mtl_bench.engine.progress import use_bar
from mtl_bench.engine.trainer import Trainer, TrainResult, count_steps, loss_ratio_sum
from mtl_bench.errors import ConfigError
from mtl_bench.optim import build_optimizer, build_param_groups, build_scheduler
from mtl_bench.run_logger import RunLogger, flatten_hparams

log = logging.getLogger("mtl_bench")

METRICS_FILE = "metrics.json"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def previous_status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / METRICS_FILE).read_text()).get("status")
    except (OSError, ValueError):
        return None


def record_failure(run_dir: Path, err: BaseException, step: int, overrides: list[str],
                   choices: dict[str, str]) -> None:
    """metrics.json with status "failed", so a sweep's report lists the run; a finished run's results stay."""
    if previous_status(run_dir) != "completed":
        write_json(run_dir / METRICS_FILE, {"status": "failed", "error": f"{type(err).__name__}: {err}", "step": step,
                                            "overrides": overrides, "choices": choices})


def run_experiment(cfg: DictConfig) -> float:
    """The Hydra task function's body. Returns what sweepers (Optuna) minimise: the mean over tasks of the
    final val loss divided by the task's initial loss (L_i(0), measured on test before training), so that
    tasks of very different loss scales weigh the same."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    choices = {group: option for group, option in hydra_cfg.runtime.choices.items()
               if not group.startswith(("hydra", "schema")) and option is not None}
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        conf: RunConf = OmegaConf.to_object(cfg)  # type checks happened at compose time; value checks run here
    except ConfigError as err:
        record_failure(run_dir, err, 0, list(hydra_cfg.overrides.task), choices)
        raise
    if conf.trainer.num_threads is None:
        conf.trainer.num_threads = threads_per_parallel_job(hydra_cfg.launcher)
    result = train(
        conf,
        run_dir,
        overrides=list(hydra_cfg.overrides.task),
        choices=choices,
        multirun=hydra_cfg.mode == RunMode.MULTIRUN,
        config=OmegaConf.to_container(cfg, resolve=True),
    )
    return loss_ratio_sum(result.val, result.initial_test) / len(result.val)


def threads_per_parallel_job(launcher: Any) -> int | None:
    """Under the joblib launcher, cores // parallel jobs torch threads per job, so jobs do not oversubscribe
    the cores (each would otherwise start one thread per core); None (torch's default) for other launchers."""
    if "joblib" not in str(launcher.get("_target_", "")):
        return None
    cores = os.cpu_count() or 1
    n_jobs = launcher.get("n_jobs") or -1
    jobs = cores + 1 + n_jobs if n_jobs < 0 else n_jobs  # joblib: -1 is every core, -2 all but one, ...
    return max(1, cores // max(1, min(jobs, cores)))


def train(
    conf: RunConf,
    run_dir: Path,
    *,
    overrides: list[str] | None = None,
    choices: dict[str, str] | None = None,
    multirun: bool = False,
    config: dict[str, Any] | None = None,
) -> TrainResult:
    """Train `conf` with outputs in `run_dir`; usable without Hydra (tests, notebooks).

    Under torchrun (WORLD_SIZE > 1) every rank trains its slice of each batch with DDP; rank 0's run_dir
    is used by all (for resume) and rank 0 alone writes to it.
    """
    overrides, choices = overrides or [], choices or {}
    if conf.trainer.num_threads:
        torch.set_num_threads(conf.trainer.num_threads)
    device = pick_device(conf.trainer.device)
    dist_info = init_distributed(device)
    device = rank_device(device, dist_info)
    run_dir = Path(broadcast_text(str(run_dir)))
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_path = find_checkpoint(conf.trainer.resume, run_dir)

    seed_everything(conf.seed)
    taskset = build_taskset(conf.tasks).to(device)
    model = build_model(conf.model, taskset).to(device)
    balancer = build_balancer(conf.balancer, taskset.tasks, model).to(device)
    groups = build_param_groups(model, conf.optim.lr, getattr(conf.optim, "weight_decay", None), conf.optim.paramwise)
    optimizer = build_optimizer(conf.optim, groups)
    total_steps = count_steps(conf.trainer, len(taskset.train), dist_info.world_size)
    scheduler = build_scheduler(conf.optim.schedule, optimizer, total_steps)
    forward_model = wrap_ddp(model, device, dist_info, per_task=conf.trainer.step_mode == "per_task")

    logger: RunLogger | None = None
    trainer: Trainer | None = None
    try:
        trainer = Trainer(
            taskset=taskset, model=model, balancer=balancer, optimizer=optimizer,
            scheduler=scheduler, conf=conf.trainer, seed=conf.seed, run_dir=run_dir, logger=None,
            bar=use_bar(conf.trainer.progress, multirun) and dist_info.is_main,
            precision=build_precision(conf.precision, device), forward_model=forward_model,
            rank=dist_info.rank, world_size=dist_info.world_size,
        )
        if checkpoint_path is not None:
            trainer.restore(load_checkpoint(checkpoint_path, device), checkpoint_path)
        if not dist_info.is_main:
            return trainer.fit()
        logger = RunLogger(run_dir, purge_step=trainer.step or None)
        trainer.logger = logger
        metric_names = {t.name: ["loss", *t.higher_is_better] for t in taskset.tasks}
        if trainer.step == 0:
            # `overrides` first: the HParams table then shows what each run of a sweep changed
            hparam_values = {"overrides": " ".join(overrides) or "(none)",
                             **{f"choice.{g}": o for g, o in choices.items()}, **flatten_hparams(config or {})}
            final_tags = [f"metric/test/{t}/{m}" for t, names in metric_names.items() for m in names]
            logger.write_hparams(hparam_values, final_tags + ["summary/test_loss_ratio_sum"])
        ranks = f" x {dist_info.world_size} ranks" if dist_info.world_size > 1 else ""
        log.info("run dir %s | %d steps on %s%s (%d threads), %s, %s mode | tasks %s", run_dir, trainer.total_steps,
                 device, ranks, torch.get_num_threads(), conf.precision.name, conf.trainer.step_mode,
                 taskset.task_names)
        result = trainer.fit()
    except BaseException as err:
        if dist_info.is_main:
            record_failure(run_dir, err, trainer.step if trainer is not None else 0, overrides, choices)
        raise
    finally:
        if logger is not None:
            logger.close()
        shutdown_distributed(dist_info)

    write_json(run_dir / METRICS_FILE, {
        "status": "completed",
        "step": result.step,
        "wall_time_s": round(result.wall_time_s, 3),
        "overrides": overrides,
        "choices": choices,
        "seed": conf.seed,
        "val": result.val,
        "test": result.test,
        "summary": result.summary,
        "initial_test": result.initial_test,
        "higher_is_better": {t.name: {"loss": False, **t.higher_is_better} for t in taskset.tasks},
        "model_selection": "final step",
        "reference": conf.tasks.reference,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    })
    log.info("done: %d steps in %.1f s; final metrics in %s", result.step, result.wall_time_s, run_dir / METRICS_FILE)
    return result
