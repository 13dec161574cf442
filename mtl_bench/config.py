"""The run-level structured config: the trainer's settings, seed and labels, each declared once.

The parts (model, tasks, balancer, optim, optim.schedule, precision, select, logger) are not declared here: each YAML
names its class by `_target_`, and the class's constructor signature is the one declaration of its
options (engine/builders.py checks the keys and types against it before anything is built). The
trainer's settings are the loop's own, declared once here with `option(...)`: its help text and its facts
(may it change when a run resumes? does it change what is trained, so that the report tells runs apart by
it? is it a key the engine reads from a part's node?) are metadata on the field, and the resume check, the
report's grouping, the config check and docs/configuration.md read them from there. Value checks run in
`__post_init__` (when `OmegaConf.to_object` builds the objects) and raise ConfigError.
This module imports nothing of ours but the error type and the settings' parsers, and no torch.
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from mtl_bench.errors import ConfigError
from mtl_bench.settings import Length, check_setting, compile_mode, to_steps


def option(
    default: Any = MISSING,
    help: str = "",
    *,
    resumable: bool = False,
    training: bool = True,
    factory: Optional[Callable[[], Any]] = None,
    group: bool = False,
) -> Any:
    """A config field with its facts. resumable: may differ when a run resumes (how long, how often it logs,
    where it runs); training: changes what is trained or reported, so `mtl-bench report` groups runs by it (how
    often a run logs or where it runs does not); group: a config group whose default (None) means none chosen."""
    metadata = {"help": help, "resumable": resumable, "training": training, "group": group}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _positive(key: str, value: float | int | None) -> None:
    _require(value is not None and value > 0, key, value, "must be > 0")


def _non_negative(key: str, value: float | int) -> None:
    _require(value >= 0, key, value, "must be >= 0")


def _length(key: str, value: Any, least: int) -> None:
    """Steps (an int >= least) or a string in epochs or % of the run (its steps are known in the recipe)."""
    _check_with(lambda v: to_steps(key, v, 1, 100), value)
    _require(not isinstance(value, int) or value >= least, key, value, f"must be >= {least}")


def _check_with(parse: Callable[[Any], Any], value: Any) -> None:
    """A setting's own parser (its ValueError names the key) as a ConfigError."""
    try:
        parse(value)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    _require(value in allowed, key, value, "allowed: " + ", ".join(allowed))


# ----------------------------------------------------------------------------- trainer


@dataclass
class GradClipConf:
    """mmcv's grad_clip: by global norm (max_norm, norm_type) or by value; grad_norm/total is logged either way."""

    max_norm: Optional[float] = option(None, "clip the global gradient norm to this (null: no clipping by norm)")
    norm_type: float = option(2.0, "the norm's p")
    clip_value: Optional[float] = option(None, "or clamp every gradient element to [-clip_value, clip_value]")

    def __post_init__(self) -> None:
        _require(self.max_norm is None or self.max_norm > 0, "trainer.grad_clip.max_norm", self.max_norm, "null or > 0")
        _require(
            self.clip_value is None or self.clip_value > 0,
            "trainer.grad_clip.clip_value",
            self.clip_value,
            "null or > 0",
        )
        _require(
            self.max_norm is None or self.clip_value is None,
            "trainer.grad_clip",
            "max_norm and clip_value",
            "one of max_norm or clip_value",
        )
        _positive("trainer.grad_clip.norm_type", self.norm_type)


@dataclass
class FrontConf:
    """Evaluation of a preference-conditioned model (model/front=...) at preferences spread on the simplex."""

    rays: int = option(
        0,
        "evaluate a model/front=... at K preferences spread evenly on the simplex, on val at every evaluation and on "
        "val and test at the end (metrics.json `front`); 0: none",
        resumable=True,
        training=False,
    )
    preferences: Optional[list[Any]] = option(
        None,
        "more preferences to evaluate at, each [r_1, ..., r_T] (>= 0, task order; scaled to sum 1) or {task: r_i}",
        resumable=True,
        training=False,
    )

    def __post_init__(self) -> None:
        _require(isinstance(self.rays, int) and self.rays >= 0, "trainer.front.rays", self.rays, "an integer >= 0")


@dataclass
class TrainerConf:
    max_steps: Optional[int] = option(
        1000,
        "optimizer steps to train, unless trainer.epochs is set (a length typed on the command line replaces the "
        "other)",
        resumable=True,
    )
    epochs: Optional[int] = option(
        None,
        "passes over the training split; when set, the run's length (instead of trainer.max_steps)",
        resumable=True,
    )
    batch_size: int = option(128, "samples per optimizer step (per task with step_mode=per_task)")
    eval_every: Length = option(
        250,
        "evaluate on val every N steps, or '<n> epochs', or '<p>%' of the run (and always at the end)",
        resumable=True,
        training=False,
    )
    eval_batch_size: int = option(
        1024,
        "samples per evaluation batch (images from disk: keep it small; dense task sets need a multiple of "
        "tasks.error_batch)",
        resumable=True,
        training=False,
    )
    log_every: Length = option(
        50,
        "read losses and weights from the device and log them every N steps (or '<n> epochs', '<p>%')",
        resumable=True,
        training=False,
    )
    checkpoint_every: Length = option(
        500,
        "write checkpoints/last.pt every N steps, or '<n> epochs', or '<p>%' (and at the end); 0: only at the end",
        resumable=True,
        training=False,
    )
    resume: Optional[str] = option(
        None,
        "null | auto (this run dir's checkpoint, if any) | a checkpoint or run-dir path",
        resumable=True,
        training=False,
    )
    device: str = option("auto", "auto | cpu | cuda | cuda:N", resumable=True, training=False)
    num_threads: Any = option(
        "auto",
        "torch intra-op threads: auto (1 for a small model, else the cores over the runs started at once, at most "
        "the cores idle at the start) | N | "
        "null (torch's default)",
        resumable=True,
        training=False,
    )
    compile: Any = option(
        False,
        "torch.compile the model's trunk: false | true | default | reduce-overhead | max-autotune | "
        "max-autotune-no-cudagraphs",
        resumable=True,
        training=False,
    )
    num_workers: int = option(
        0, "DataLoader worker processes for task sets read from disk", resumable=True, training=False
    )
    progress: str = option(
        "auto", "auto (a bar on a terminal, log lines otherwise) | bar | log", resumable=True, training=False
    )
    grad_clip: GradClipConf = option(help="gradient clipping (mmcv's grad_clip)", factory=GradClipConf)
    front: FrontConf = option(help="a preference-conditioned model's front (docs/pareto_front.md)", factory=FrontConf)
    detect_anomalous_params: bool = option(
        False, "name, once, every trainable parameter that does not reach the loss", training=False
    )
    step_mode: str = option(
        "joint",
        "joint (one batch carries every task's targets) | per_task (one batch per task, forwarded and "
        "backpropagated in turn, one optimizer step)",
    )
    grad_accumulation_steps: Optional[int] = option(
        None,
        "loader steps per optimizer step; the gradient is their mean; null: as many as the balancer needs (3 for a "
        "method whose independent draws are the micro-batches, said in the log), else 1",
    )
    only_tasks: Optional[list[str]] = option(
        None,
        "train only these tasks of the task set (the same model with only their heads: a single-task baseline, as "
        "`mtl-bench study` makes them); null: every task",
    )
    on_nonfinite: str = option("skip", "a non-finite loss: skip the step (counted, logged) | raise (stop)")
    max_skipped_fraction: Optional[float] = option(
        0.1,
        "stop as diverged when more than this fraction of the last skipped_window steps were skipped; null: never",
        resumable=True,
    )
    skipped_window: int = option(100, "steps the skipped fraction is counted over", resumable=True)
    diagnostics: bool = option(
        False,
        "per-task gradient norms and cosines and a cosine heatmap every diagnostics_every steps (any balancer; "
        "one extra backward per task at those steps)",
        resumable=True,
        training=False,
    )
    diagnostics_every: int = option(
        100, "steps between gradient diagnostics (a log point)", resumable=True, training=False
    )
    validation_source: str = option(
        "holdout",
        "where a bilevel balancer (one that draws validation batches: kind bilevel in docs/methods.md) draws them: "
        "holdout (trainer.validation_holdout of the training split, set aside by the seed and not trained on) | "
        "val (the task set's val split, which also selects and reports the model); unused by other balancers",
    )
    validation_holdout: float = option(0.1, "holdout: the fraction of the training split set aside, 0 < f < 1")
    profile: bool = option(
        False,
        "write a torch profiler trace of a few steps (TensorBoard's profile tab)",
        resumable=True,
        training=False,
    )

    def __post_init__(self) -> None:
        _require(self.max_steps is None or self.max_steps > 0, "trainer.max_steps", self.max_steps, "null or > 0")
        _require(self.epochs is None or self.epochs > 0, "trainer.epochs", self.epochs, "null or > 0")
        _require(
            self.max_steps is not None or self.epochs is not None,
            "trainer.max_steps",
            self.max_steps,
            "set trainer.max_steps or trainer.epochs",
        )
        for key in ("batch_size", "eval_batch_size"):
            _positive(f"trainer.{key}", getattr(self, key))
        for key, least in (("eval_every", 1), ("log_every", 1), ("checkpoint_every", 0)):
            _length(f"trainer.{key}", getattr(self, key), least)
        _require(
            self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
            "trainer.device",
            self.device,
            "auto, cpu, cuda or cuda:N",
        )
        _check_with(check_setting, self.num_threads)
        _check_with(compile_mode, self.compile)
        _non_negative("trainer.num_workers", self.num_workers)
        _one_of("trainer.progress", self.progress, ("auto", "bar", "log"))
        _one_of("trainer.step_mode", self.step_mode, ("joint", "per_task"))
        if self.grad_accumulation_steps is not None:
            _positive("trainer.grad_accumulation_steps", self.grad_accumulation_steps)
        _one_of("trainer.on_nonfinite", self.on_nonfinite, ("skip", "raise"))
        _require(
            self.max_skipped_fraction is None or 0 <= self.max_skipped_fraction <= 1,
            "trainer.max_skipped_fraction",
            self.max_skipped_fraction,
            "null or 0..1",
        )
        _positive("trainer.skipped_window", self.skipped_window)
        _positive("trainer.diagnostics_every", self.diagnostics_every)
        _one_of("trainer.validation_source", self.validation_source, ("holdout", "val"))
        _require(0 < self.validation_holdout < 1, "trainer.validation_holdout", self.validation_holdout, "0 < f < 1")


# ----------------------------------------------------------------------------- the optimizer's engine keys


@dataclass
class OptimEngineKeys:
    """Keys of the `optim` node that the engine reads itself and does not pass to the optimizer class (the
    class's own options, lr and weight_decay among them, are its signature's)."""

    schedule: Any = option(help="the learning-rate schedule (optim/schedule=<option>)")
    paramwise: Any = option(None, "mmcv-style per-parameter lr and weight-decay multipliers (optim/paramwise.py)")


# Per part: the keys of its node that the engine reads itself.
ENGINE_KEYS: dict[str, tuple[str, ...]] = {
    "optim": tuple(f.name for f in dataclasses.fields(OptimEngineKeys)),
    "model": ("front",),  # the preference-conditioned model around the model (model/front=<option>)
    "tasks": ("front_reference",),  # {task: loss}: the hypervolume's reference point (engine/front_evaluation.py)
}
# Part options that are labels: the task set's published reference numbers are read by the report, never by training.
PART_LABELS = ("tasks.reference",)


# ----------------------------------------------------------------------------- top level


@dataclass
class RunConf:
    model: Any = option(help="the multi-task model (model=<option>)")
    tasks: Any = option(help="the task set (tasks=<option>)")
    balancer: Any = option(help="the loss balancer (balancer=<option>)")
    optim: Any = option(help="the optimizer and its schedule (optim=<option>, optim/schedule=<option>)")
    precision: Any = option(help="fp32 | fp16 | bf16 (precision=<option>)")
    select: Any = option(
        help="which evaluation the run reports (select=<option>): final (the last step) | best_val (the test metrics "
        "at the evaluation with the best select.criterion on val) | last_k (the mean test metrics of the last "
        "select.k evaluations)"
    )
    logger: Any = option(
        None,
        "where scalars, images and hparams go: logger=tensorboard (the default) | csv | [tensorboard,csv] | a "
        "user's own +logger.<name>._target_=<class>; ~logger: the console only",
        resumable=True,
        training=False,
        group=True,
    )
    callbacks: Any = option(
        None,
        "a run's own loop callbacks: +callbacks.<name>._target_=<class> (a subclass of "
        "mtl_bench.engine.callbacks.Callback) and +callbacks.<name>.<key>=<value> for its arguments",
        training=False,
    )
    trainer: TrainerConf = option(help="the loop's settings", factory=TrainerConf)
    seed: int = option(0, "seed of every random draw; runs over seeds form one group in the report", training=False)
    tag: Any = option(
        None,
        "free-form labels: tag=<text> or +tag.<name>=<value>; shown in TensorBoard's hparams and the report, "
        "never read by training",
        resumable=True,
        training=False,
    )


def section_schema(f: dataclasses.Field) -> Optional[type]:
    """The dataclass a field holds (trainer, trainer.grad_clip), or None for a plain option."""
    kind = f.type if isinstance(f.type, type) else globals().get(str(f.type))  # annotations are strings here
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def options(schema: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """(dotted key, field) of every option of a schema, nested dataclasses included."""
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        yield key, f
        kind = section_schema(f)
        if kind is not None:
            yield from options(kind, prefix=f"{key}.")


def keys_where(fact: str, value: bool = True) -> tuple[str, ...]:
    """The run-level keys whose metadata `fact` (resumable, training) equals `value`."""
    return tuple(key for key, f in options(RunConf) if f.metadata.get(fact, True) == value)


def option_defaults() -> dict[str, Any]:
    """Each run-level key with a default value (not a section, not a config group): its default."""
    return {
        key: f.default
        for key, f in options(RunConf)
        if f.default_factory is dataclasses.MISSING and f.default is not MISSING and not f.metadata["group"]
    }


def options_markdown() -> str:
    """docs/configuration.md's list of the run-level options, from their declarations (lines within 120 columns)."""
    lines = []
    for key, f in options(RunConf):
        if f.default_factory is not dataclasses.MISSING:
            continue  # a section (trainer, trainer.grad_clip): its options follow
        if f.default is MISSING or f.metadata["group"]:
            facts = ["a config group"]
        else:
            default = f.default
            shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
            facts = [f"default `{shown}`"]
            facts.append("may change on resume" if f.metadata["resumable"] else "fixed on resume")
            if not f.metadata["training"]:
                facts.append("not a training key: the report does not tell runs apart by it")
        text = f"- `{key}` ({'; '.join(facts)}): {f.metadata['help']}"
        lines.append(textwrap.fill(text, width=120, subsequent_indent="  ", break_on_hyphens=False))
    return "\n".join(lines) + "\n"


# The keys `mtl-bench train --help` describes (the rest: docs/configuration.md, and --cfg job for every value).
HELP_KEYS = (
    "seed",
    "tag",
    "trainer.max_steps",
    "trainer.epochs",
    "trainer.batch_size",
    "trainer.device",
    "trainer.num_threads",
    "trainer.resume",
)


def options_summary(width: int = 100) -> str:
    """HELP_KEYS as `key=default  help`, the help wrapped within `width` columns."""
    declared = dict(options(RunConf))
    items = []
    for key in HELP_KEYS:
        default = declared[key].default
        shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        items.append((f"{key}={shown}", " ".join(declared[key].metadata["help"].split())))
    pad = max(len(name) for name, _ in items) + 2
    indent = " " * (pad + 2)
    return "\n".join(
        textwrap.fill(
            text, width, initial_indent=f"  {name.ljust(pad)}", subsequent_indent=indent, break_on_hyphens=False
        )
        for name, text in items
    )


def register_configs() -> None:
    """The run-level schema (trainer, seed, tag); the parts are checked against their classes' signatures."""
    ConfigStore.instance().store(name="schema_run", node=RunConf)


register_configs()
