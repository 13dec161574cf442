"""The Hydra task function's body: check the composed config, train it, return what sweepers minimise."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from mtl_bench.engine.files import write_json

log = logging.getLogger("mtl_bench")

METRICS_FILE = "metrics.json"


def previous_status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / METRICS_FILE).read_text()).get("status")
    except (OSError, ValueError):
        return None


def record_failure(run_dir: Path, err: BaseException, step: int, overrides: list[str], choices: dict[str, str]) -> None:
    """metrics.json with status "failed" (or "diverged"), so a sweep's report lists the run with its reason;
    a finished run's results stay."""
    from mtl_bench.errors import DivergedError, Interrupted

    if run_dir.is_dir() and previous_status(run_dir) != "completed":
        status = (
            "diverged"
            if isinstance(err, DivergedError)
            else "interrupted"
            if isinstance(err, Interrupted)
            else "failed"
        )
        write_json(
            run_dir / METRICS_FILE,
            {
                "status": status,
                "error": f"{type(err).__name__}: {err}",
                "reason": str(err).splitlines()[0] if str(err) else type(err).__name__,
                "step": step,
                "overrides": overrides,
                "choices": choices,
            },
        )


def check_config(cfg: DictConfig, overrides: list[str]) -> None:
    """Every part's keys and values against its class's signature, before anything is built.

    A part whose `_target_` was replaced on the command line (`model._target_=my_lab.Net`) keeps only the keys
    its new class takes or the command line set: the option's own keys (mlp's `widths`) belong to the class
    it was written for.
    """
    from mtl_bench.engine.builders import ENGINE_KEYS, SUPPLIED, check_part, node_dict, parameters, target_of

    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    for key, supplied in SUPPLIED.items():
        node = OmegaConf.select(cfg, key)
        if f"{key}._target_" in given and isinstance(node, DictConfig):
            params = parameters(target_of(key, node_dict(node)))
            dropped = [
                k
                for k in map(str, node)
                if not k.startswith("_")
                and k not in params
                and f"{key}.{k}" not in given
                and k not in ENGINE_KEYS.get(key, ())
            ]
            with open_dict(node):
                for k in dropped:
                    node.pop(k)
            if dropped:
                log.debug("%s._target_ set: the option's keys %s do not apply to it and were dropped", key, dropped)
        check_part(key, node_dict(node), supplied, ENGINE_KEYS.get(key, ()))


def run_experiment(cfg: DictConfig) -> float:
    """Returns what sweepers (Optuna) minimise: the mean over tasks of the final val loss divided by the
    task's initial loss (L_i(0), measured on test before training), so that tasks of very different loss
    scales weigh the same."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from mtl_bench.engine.progress import use_bar
    from mtl_bench.engine.recipe import loss_ratio_sum, train
    from mtl_bench.engine.threads import cores_of, parallel_runs_of

    hydra_cfg = HydraConfig.get()
    choices = {
        group: option
        for group, option in hydra_cfg.runtime.choices.items()
        if not group.startswith("hydra") and option is not None
    }
    run_dir = Path(hydra_cfg.runtime.output_dir)
    overrides = list(hydra_cfg.overrides.task)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        check_config(cfg, overrides)
        OmegaConf.to_object(cfg.trainer)  # the trainer's value checks
    except Exception as err:
        if multirun:
            record_failure(run_dir, err, 0, overrides, choices)  # the sweep's report lists the job
        else:
            remove_if_only_hydras(run_dir)  # nothing was built: a typo leaves no run directory behind
        raise
    result = train(
        cfg,
        run_dir,
        overrides=overrides,
        choices=choices,
        bar=use_bar(cfg.trainer.progress, multirun) and int(os.environ.get("RANK", "0")) == 0,
        parallel_runs=parallel_runs_of(hydra_cfg.launcher),
        cores=cores_of(hydra_cfg.launcher),
    )
    return loss_ratio_sum(result.val, result.initial_test) / len(result.val)


def remove_if_only_hydras(run_dir: Path) -> None:
    """Remove a run directory that holds nothing but what Hydra wrote when the job started."""
    if not run_dir.is_dir() or not all(p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir()):
        return
    logging.shutdown()  # the job's log file handler
    shutil.rmtree(run_dir, ignore_errors=True)
