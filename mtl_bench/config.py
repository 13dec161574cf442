"""The run-level structured config: the trainer's settings, seed and tag.

The parts (model, tasks, balancer, optim, optim.schedule, precision) are not declared here: each YAML
names its class by `_target_`, and the class's constructor signature is the one declaration of its
options (engine/builders.py checks the keys and types against it before anything is built). The
trainer's settings are the loop's own, declared once here; their value checks run in `__post_init__`
(when `OmegaConf.to_object` builds the objects) and raise ConfigError.
This module imports nothing of ours but the error type, and no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from mtl_bench.errors import ConfigError


def _require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _positive(key: str, value: float | int | None) -> None:
    _require(value is not None and value > 0, key, value, "must be > 0")


def _non_negative(key: str, value: float | int) -> None:
    _require(value >= 0, key, value, "must be >= 0")


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

    max_norm: Optional[float] = None  # null: no clipping by norm
    norm_type: float = 2.0
    clip_value: Optional[float] = None  # clamp every gradient element to [-clip_value, clip_value]

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
class TrainerConf:
    max_steps: int = 1000  # optimizer steps; ignored when epochs is set
    epochs: Optional[int] = None  # train for this many passes over the training split instead
    batch_size: int = 128
    eval_every: int = 250  # evaluate on val every N steps (and always at the end)
    # samples per evaluation batch (image task sets read from disk: keep it small enough for the device's
    # memory; dense task sets average errors per error_batch images and need a multiple of it)
    eval_batch_size: int = 1024
    log_every: int = 50  # read losses/weights from the device and log them every N steps
    checkpoint_every: int = 500  # save checkpoints/last.pt every N steps (and always at the end); 0 = only at the end
    resume: Optional[str] = None  # null | auto (this run dir's checkpoint, if any) | a checkpoint or run-dir path
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # torch intra-op threads: auto (1 for a small model, else the cores this process may use over the runs
    # started at once; engine/threads.py) | an integer | null (torch's default: one per core)
    num_threads: Any = "auto"
    compile: Any = False  # torch.compile the model's trunk: false | true | a mode (engine/compile.py)
    num_workers: int = 0  # DataLoader worker processes for task sets read from disk (in-memory sets ignore it)
    progress: str = "auto"  # auto (bar on a terminal, log lines otherwise) | bar | log
    grad_clip: GradClipConf = field(default_factory=GradClipConf)
    # name, once, every trainable parameter that does not reach the loss (costs a graph walk per session)
    detect_anomalous_params: bool = False
    # joint: one batch carries every task's targets; per_task: one batch per task (its own sample stream),
    # forwarded and backpropagated in turn, gradients accumulate, one optimizer step
    step_mode: str = "joint"
    grad_accumulation_steps: int = 1  # loader steps per optimizer step; the gradient is their mean
    on_nonfinite: str = "skip"  # a non-finite loss: skip the step (counted, logged) | raise (stop, naming task/step)
    # skip: stop the run as diverged when more than this fraction of the last skipped_window steps were
    # skipped for non-finite losses or gradients (checked at log points); null: never
    max_skipped_fraction: Optional[float] = 0.1
    skipped_window: int = 100
    diagnostics_every: int = (
        100  # with balancer.diagnostics=true: gradient diagnostics at every N-th step (a log point)
    )
    profile: bool = False  # write a torch profiler trace of a few steps (TensorBoard's profile tab)

    def __post_init__(self) -> None:
        _positive("trainer.max_steps", self.max_steps)
        _require(self.epochs is None or self.epochs > 0, "trainer.epochs", self.epochs, "null or > 0")
        for key in ("batch_size", "eval_every", "eval_batch_size", "log_every"):
            _positive(f"trainer.{key}", getattr(self, key))
        _non_negative("trainer.checkpoint_every", self.checkpoint_every)
        _require(
            self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
            "trainer.device",
            self.device,
            "auto, cpu, cuda or cuda:N",
        )
        # imported here: the parsers live with the engine code that uses them, and this module stays free of torch
        from mtl_bench.engine.compile import compile_mode
        from mtl_bench.engine.threads import check_setting

        _check_with(check_setting, self.num_threads)
        _check_with(compile_mode, self.compile)
        _non_negative("trainer.num_workers", self.num_workers)
        _one_of("trainer.progress", self.progress, ("auto", "bar", "log"))
        _one_of("trainer.step_mode", self.step_mode, ("joint", "per_task"))
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


# ----------------------------------------------------------------------------- top level


@dataclass
class RunConf:
    model: Any = MISSING
    tasks: Any = MISSING
    balancer: Any = MISSING
    optim: Any = MISSING
    precision: Any = MISSING
    trainer: TrainerConf = field(default_factory=TrainerConf)
    seed: int = 0
    # free-form label shown in TensorBoard's hparams table and in `mtl-bench report`
    tag: Optional[str] = None


def register_configs() -> None:
    """The run-level schema (trainer, seed, tag); the parts are checked against their classes' signatures."""
    ConfigStore.instance().store(name="schema_run", node=RunConf)


register_configs()
