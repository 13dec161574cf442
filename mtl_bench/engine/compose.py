"""From the composed config to the parts of a run: check every key first, then build each part by `_target_`.

`finalise_config` runs first thing in `recipe.train()` (so the CLI and the Python API take the same path), before
anything is built (a typo costs no model build): it finalises the composed config in place (a length typed on the
command line replaces the preset's; a replaced `_target_` drops the option's own keys) and turns what a user typed
into one line when it is refused: an unknown key anywhere, both run lengths on the command line, a part's key its
class does not take. `build_parts` builds the task set, model, balancer, optimizer, schedule and precision in
the order their arguments need each other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional

import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.utils.data import Dataset

from mtl_bench.analysis.runs import override_key
from mtl_bench.balancers import Balancer
from mtl_bench.balancers.validation_source import needs_validation
from mtl_bench.catalog import conf_root
from mtl_bench.config import ENGINE_KEYS, RunConf, TrainerConf, section_schema
from mtl_bench.engine.builders import (
    LOGGER_SUPPLIED,
    SUPPLIED,
    build,
    check_part,
    node_dict,
    option_names,
    parameters,
    target_of,
)
from mtl_bench.engine.callbacks import Callback, Callbacks, check_callbacks, user_callbacks
from mtl_bench.engine.checkpoint import RUN_STATE_KEYS
from mtl_bench.engine.compat import check_model_balancer
from mtl_bench.engine.data import hold_out
from mtl_bench.engine.diagnostics import Diagnostics
from mtl_bench.engine.front_evaluation import build_front_model, check_front, front_run
from mtl_bench.engine.metric_logging import MetricLogging
from mtl_bench.engine.precision import Precision
from mtl_bench.engine.preemption import Preemption
from mtl_bench.engine.schedule_on_val import ScheduleOnVal
from mtl_bench.engine.selection import ModelSelection, Selection, eval_steps
from mtl_bench.engine.step import optimizer_steps_per_epoch, resolve_accumulation, samples_per_epoch
from mtl_bench.engine.validation import ValidationStream
from mtl_bench.errors import ConfigError
from mtl_bench.gradient_engine.balancer import BUILD_ARGUMENTS
from mtl_bench.hydra_errors import closest
from mtl_bench.loggers.base import missing_methods
from mtl_bench.models import MultiTaskModel
from mtl_bench.optim import build_param_groups
from mtl_bench.settings import to_steps
from mtl_bench.tasks import TaskSet

log = logging.getLogger("mtl_bench")

LENGTH_KEYS = ("trainer.max_steps", "trainer.epochs")
# Keys that moved, and where to: a user typing the old one is told the new one.
MOVED = {
    "trainer.select": "select=<final|best_val|last_k>",
    "trainer.select_criterion": "select=best_val select.criterion=<criterion>",
    "trainer.select_k": "select=last_k select.k=<k>",
}


def _unknown_keys(node: Any, schema: type, prefix: str) -> None:
    """A key under a schema's node that the schema does not declare (`+trainer.max_step=100`, `+nonsense=1`)."""
    declared = {f.name: f for f in fields(schema)}
    for key in map(str, node):
        if f"{prefix}{key}" in MOVED:
            raise ConfigError(f"{prefix}{key}: moved; now {MOVED[prefix + key]}")
        if key not in declared:
            where = prefix.rstrip(".") or "the config"
            hint = closest(key, list(declared)) or (
                "; free-form labels go under tag: +tag.<name>=<value>" if not prefix else ""
            )
            raise ConfigError(f"{prefix}{key}: not a key of {where}{hint}; keys: {', '.join(declared)}")
        kind = section_schema(declared[key])
        child = node[key]
        if kind is not None and isinstance(child, DictConfig):
            _unknown_keys(child, kind, f"{prefix}{key}.")


def typed_keys(overrides: list[str]) -> dict[str, str]:
    """{config key: the value typed} of the command line's overrides (`optim/schedule=x` sets optim.schedule)."""
    return {override_key(o): o.split("=", 1)[1] for o in overrides if "=" in o}


def apply_length(cfg: DictConfig, typed: dict[str, str]) -> None:
    """One way to say how long: a length typed on the command line replaces the preset's (the other is
    dropped); both typed is an error."""
    given = [key for key in LENGTH_KEYS if key in typed and typed[key].lower() not in ("null", "none")]
    if len(given) == 2:
        raise ConfigError("trainer.max_steps and trainer.epochs: give one of them (a run's length is one or the other)")
    if given:
        other = LENGTH_KEYS[1 - LENGTH_KEYS.index(given[0])]
        with open_dict(cfg):
            OmegaConf.update(cfg, other, None)


def finalise_config(cfg: DictConfig, overrides: list[str]) -> None:
    """Finalise the composed config in place and check every key against its declaration, before anything is
    built; `overrides`: what was typed on the command line (or given to `train()`), which decides what wins.

    Run-level keys (trainer, seed, tag) against config.RunConf; each part's keys and values against its
    class's signature. A part whose `_target_` was replaced on the command line (`model._target_=my_lab.Net`)
    keeps only the keys its new class takes or the command line set: the option's own keys (mlp's `widths`, its
    default `arch`) belong to the class it was written for; a key typed with it (`model/arch=mmoe`) is checked.
    """
    given = typed_keys(overrides)
    apply_length(cfg, given)
    _unknown_keys(cfg, RunConf, "")
    for key, supplied in SUPPLIED.items():
        node = OmegaConf.select(cfg, key)
        if node is None and key in ("model.arch", "model.front"):  # no architecture (the user's own class), no front
            continue
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
    check_loggers(cfg)
    check_callbacks(cfg)
    check_validation_keys(cfg, given)


def check_loggers(cfg: DictConfig) -> None:
    """Each node under `logger:` names a class by `_target_` and takes its keys (the engine supplies `run`)."""
    loggers = cfg.get("logger")
    if loggers is None:
        return
    if not isinstance(loggers, DictConfig):
        raise ConfigError(
            f"logger={loggers!r}: expected loggers by name (logger=tensorboard, logger=[tensorboard,csv], "
            "+logger.<name>._target_=<class>)"
        )
    for name in map(str, loggers):
        node = loggers[name]
        if not isinstance(node, DictConfig):
            raise ConfigError(f"logger.{name}: expected a node with _target_, got {node!r}")
        target = check_part(f"logger.{name}", node_dict(node), LOGGER_SUPPLIED)
        missing = missing_methods(target) if isinstance(target, type) else []
        if missing:
            raise ConfigError(
                f"logger.{name}._target_: {node._target_} has no {', '.join(missing)}; a logger subclasses "
                "mtl_bench.loggers.Logger (whose methods do nothing until overridden) or defines them all"
            )


def check_validation_keys(cfg: DictConfig, typed: dict[str, str]) -> None:
    """The validation stream's keys, typed, are used or refused: only a balancer that declares `validation` reads
    them, and validation_holdout only with validation_source=holdout."""
    keys = [k for k in ("trainer.validation_source", "trainer.validation_holdout") if k in typed]
    if not keys:
        return
    balancer = target_of("balancer", node_dict(cfg.balancer))
    if not needs_validation(balancer):
        raise ConfigError(
            f"{keys[0]}: read only by a balancer that draws validation batches (a bilevel method, kind bilevel in "
            f"docs/methods.md); {getattr(balancer, '__name__', balancer)} draws none"
        )
    if "trainer.validation_holdout" in typed and cfg.trainer.validation_source != "holdout":
        raise ConfigError(
            f"trainer.validation_holdout: read only with trainer.validation_source=holdout, not "
            f"{cfg.trainer.validation_source}"
        )


def part_keys(overrides: list[str]) -> Callable[[str, str], Optional[list[str]]]:
    """For a composition error's hint (hydra_errors.describe): the keys of the part at `section`, from the config
    composed again without the bad key's override (a sweep's overrides at their first value). None when that
    config does not compose either (another bad override, a user's --config-dir)."""

    def keys(section: str, bad_key: str) -> Optional[list[str]]:
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.override_parser.overrides_parser import OverridesParser

        try:
            typed = [o for o in overrides if override_key(o) != bad_key]
            parsed = OverridesParser.create().parse_overrides(typed)
            kept = [
                f"{text.split('=', 1)[0]}={next(o.sweep_string_iterator())}" if o.is_sweep_override() else text
                for text, o in zip(typed, parsed)
            ]
            GlobalHydra.instance().clear()  # the failed composition's
            with initialize_config_dir(str(conf_root()), version_base="1.3"):
                cfg = compose("config", overrides=kept)
            node = OmegaConf.select(cfg, section)
            return option_names(section, node_dict(node)) if isinstance(node, DictConfig) else None
        except Exception:  # noqa: BLE001  (a hint only: the error line is written without it)
            return None

    return keys


@dataclass
class Parts:
    """What a run trains with, built from config."""

    taskset: TaskSet
    model: MultiTaskModel
    balancer: Balancer
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: Precision
    total_steps: int
    every: Intervals
    validation: Optional[ValidationStream] = None  # the balancer's, when it declares `validation` (bilevel)


def build_tasks(cfg: DictConfig, conf: TrainerConf, device: torch.device) -> TaskSet:
    taskset: TaskSet = build("tasks", cfg.tasks, TaskSet, ignore=ENGINE_KEYS["tasks"]).to(device)
    if conf.only_tasks is not None:
        unknown = [name for name in conf.only_tasks if name not in taskset.task_names]
        if unknown or not conf.only_tasks:
            raise ConfigError(
                f"trainer.only_tasks=[{','.join(conf.only_tasks)}]: name one or more of the tasks "
                f"{', '.join(taskset.task_names)}"
            )
        taskset.keep_only(conf.only_tasks)
    if taskset.multi_input and conf.step_mode != "per_task":
        raise ConfigError(
            f"trainer.step_mode={conf.step_mode}: tasks={type(taskset).__name__} is multi-input (each task its own "
            "images); set trainer.step_mode=per_task"
        )
    return taskset


def build_model(cfg: DictConfig, taskset: TaskSet, device: torch.device) -> MultiTaskModel:
    heads = {t.name: t.out_dim for t in taskset.tasks}
    front = build_front_model(cfg, taskset.input_shape, heads)  # model/front=...: builds the model inside it
    if front is not None:
        return front.to(device)
    return build(
        "model", cfg.model, MultiTaskModel, ignore=ENGINE_KEYS["model"], input_shape=taskset.input_shape, heads=heads
    ).to(device)


def build_balancer(
    cfg: DictConfig, conf: TrainerConf, taskset: TaskSet, model: MultiTaskModel, world_size: int, device: torch.device
) -> tuple[Balancer, Optional[ValidationStream]]:
    """Built before the training forwards: a balancer may hook the model's last shared layer. One that declares
    `validation` (a bilevel method) is given the engine's validation stream, returned with it."""
    validation = validation_for(target_of("balancer", node_dict(cfg.balancer)), conf, taskset, int(cfg.seed))
    supplied: dict[str, Any] = {
        "task_names": taskset.task_names,
        "shared_params": list(model.shared_parameters()),
        "shared_layer": model.last_shared_layer,
        "world_size": world_size,
        "initial_losses_known": {t.name: t.initial_loss for t in taskset.tasks},
        "validation": validation,
    }
    assert set(supplied) == set(BUILD_ARGUMENTS)
    balancer: Balancer = build("balancer", cfg.balancer, Balancer, **supplied).to(device)
    check_model_balancer(model, balancer, node_dict(cfg.balancer))
    check_front(model, balancer, cfg, conf)
    problem = balancer.per_task_problem() if conf.step_mode == "per_task" else None
    if problem is not None:
        raise ConfigError(f"trainer.step_mode=per_task: {problem}")
    steps = resolve_accumulation(conf, balancer)
    problem = balancer.accumulation_problem(steps)
    if problem is not None:
        raise ConfigError(f"trainer.grad_accumulation_steps={steps}: {problem}")
    return balancer, validation


def validation_for(
    balancer: Callable[..., Any], conf: TrainerConf, taskset: TaskSet, seed: int
) -> Optional[ValidationStream]:
    """The engine's validation stream for a balancer class that declares `validation`, holding its data (taken out
    of `taskset.train` with validation_source=holdout); None, and nothing held out, for any other."""
    return ValidationStream(validation_data(conf, taskset, seed)) if needs_validation(balancer) else None


def validation_data(conf: TrainerConf, taskset: TaskSet, seed: int) -> Dataset:
    """A bilevel balancer's validation batches come from the task set's val split, or from rows of the training
    split held out by the seed (taken out of `taskset.train`, so they are never trained on)."""
    if taskset.multi_input:
        raise ConfigError(f"tasks={type(taskset).__name__}: validation batches need a single-input task set")
    if conf.validation_source == "val":
        data: Dataset = taskset.val  # type: ignore[assignment]
        where = "the val split"
    else:
        taskset.train, data = hold_out(taskset.train, conf.validation_holdout, seed)  # type: ignore[arg-type]
        where = f"trainer.validation_holdout={conf.validation_holdout}"
    n = len(data)  # type: ignore[arg-type]
    if n < conf.batch_size:
        raise ConfigError(
            f"trainer.validation_source={conf.validation_source}: {where} has {n} samples, fewer than "
            f"trainer.batch_size={conf.batch_size} (a validation batch is as large as a training batch)"
        )
    return data


def build_optimizer(cfg: DictConfig, model: MultiTaskModel) -> torch.optim.Optimizer:
    optim = node_dict(cfg.optim)
    groups = build_param_groups(model, optim.get("lr", 1e-3), optim.get("weight_decay"), optim.get("paramwise"))
    return build("optim", optim, torch.optim.Optimizer, ignore=ENGINE_KEYS["optim"], params=groups)


@dataclass(frozen=True)
class Intervals:
    """trainer.eval_every, log_every and checkpoint_every in optimizer steps (0: checkpoints only at the end)."""

    eval: int
    log: int
    checkpoint: int


def intervals(conf: TrainerConf, steps_per_epoch: int, total_steps: int) -> Intervals:
    """The intervals given in steps, epochs or % of the run, as steps, now that the run's steps per epoch and
    length are known."""
    steps = {}
    for key, least in (("eval_every", 1), ("log_every", 1), ("checkpoint_every", 0)):
        value = getattr(conf, key)
        steps[key] = to_steps(f"trainer.{key}", value, steps_per_epoch, total_steps)
        if steps[key] < least:
            raise ConfigError(
                f"trainer.{key}={value!r} is {steps[key]} steps here ({steps_per_epoch} per epoch, {total_steps} in "
                f"all): must be >= {least}"
            )
    return Intervals(steps["eval_every"], steps["log_every"], steps["checkpoint_every"])


def build_parts(cfg: DictConfig, conf: TrainerConf, device: torch.device, world_size: int = 1) -> Parts:
    taskset = build_tasks(cfg, conf, device)
    model = build_model(cfg, taskset, device)
    balancer, validation = build_balancer(cfg, conf, taskset, model, world_size, device)
    optimizer = build_optimizer(cfg, model)
    steps_per_epoch = optimizer_steps_per_epoch(conf, samples_per_epoch(taskset), world_size)
    total_steps = conf.epochs * steps_per_epoch if conf.epochs else conf.max_steps
    assert total_steps is not None  # TrainerConf: one of max_steps and epochs
    schedule = node_dict(cfg.optim)["schedule"]
    scheduler = build(
        "optim.schedule", schedule, None, optimizer=optimizer, total_steps=total_steps, steps_per_epoch=steps_per_epoch
    )
    precision: Precision = build("precision", cfg.precision, Precision, device=device)
    every = intervals(conf, steps_per_epoch, total_steps)
    return Parts(taskset, model, balancer, optimizer, scheduler, precision, total_steps, every, validation)


def describe_parts(parts: Parts, extra: Optional[dict[str, Any]] = None) -> dict[str, str]:
    """Which implementation the optimizer runs, and why when it says (its `implementation` and
    `implementation_reason`), with `extra` (trainer.compile's): for metrics.json."""
    found = {}
    path = getattr(parts.optimizer, "implementation", None)
    if path is not None:
        reason = getattr(parts.optimizer, "implementation_reason", "")
        found["optim"] = f"{path} ({reason})" if reason else str(path)
    return {**found, **{k: str(v) for k, v in (extra or {}).items() if v is not None}}


def build_selection(cfg: DictConfig, parts: Parts, higher_is_better: dict[str, dict[str, bool]]) -> ModelSelection:
    """The `select=<option>` rule, given what the engine knows: the metrics, the reference, the evaluation steps."""
    steps = eval_steps(parts.total_steps, parts.every.eval)
    reference = parts.taskset.reference
    return build(
        "select", cfg.select, ModelSelection, higher_is_better=higher_is_better, reference=reference, eval_steps=steps
    )


def build_callbacks(cfg: DictConfig, conf: TrainerConf, parts: Parts, selection: ModelSelection) -> Callbacks:
    """The run's callbacks in the order the loop calls them: the selection (it sets the reported metrics before
    the others see them at the end), the front's evaluation, the loggers, the gradient diagnostics, a bilevel
    balancer's validation stream, the user's own (`callbacks:`), and the stop signals last (a stop ends the step's
    hooks)."""
    front = front_run(parts.model, parts.balancer, cfg, conf, parts.taskset.task_names)
    found: list[Callback] = [Selection(selection), *([front] if front is not None else []), MetricLogging()]
    if hasattr(parts.scheduler, "validation_step"):  # a schedule stepped by a val criterion (plateau)
        found.append(ScheduleOnVal(parts.scheduler))
    if conf.diagnostics:
        found.append(Diagnostics(conf.diagnostics_every))
    if parts.validation is not None:  # a bilevel balancer's stream: connected to the run at set-up
        found.append(parts.validation)
    return Callbacks([*found, *user_callbacks(cfg), Preemption()], taken=RUN_STATE_KEYS)
