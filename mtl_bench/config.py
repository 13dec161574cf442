"""Structured configs: one dataclass per config-group option, registered in Hydra's ConfigStore.

Each YAML under conf/<group>/<option>.yaml starts with `defaults: [/schema/<group>/<option>@_here_]`,
so Hydra type-checks every override at compose time (`optim.lr=abc` fails before anything runs).
Value checks that types cannot express (lr > 0, a known schedule name) live in `__post_init__` and
raise ConfigError; they run when `OmegaConf.to_object` builds these objects.
Adding an option = one YAML file + one dataclass here (+ the code it selects).
This module imports nothing of ours but the error type, and no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # bool subclasses int: true is no number


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    _require(value in allowed, key, value, "allowed: " + ", ".join(allowed))


# ----------------------------------------------------------------------------- model


@dataclass
class MLPConf:
    name: str = "mlp"
    widths: list[int] = field(default_factory=lambda: [100, 100, 100, 100])
    activation: str = "relu"

    def __post_init__(self) -> None:
        _require(len(self.widths) > 0 and all(w > 0 for w in self.widths), "model.widths", self.widths,
                 "a non-empty list of positive layer widths")
        _one_of("model.activation", self.activation, ("relu", "tanh", "gelu"))


@dataclass
class LeNetConf:
    name: str = "lenet"
    channels: list[int] = field(default_factory=lambda: [10, 20])
    hidden: int = 50

    def __post_init__(self) -> None:
        _require(len(self.channels) > 0 and all(c > 0 for c in self.channels), "model.channels",
                 self.channels, "a non-empty list of positive channel counts")
        _positive("model.hidden", self.hidden)


# ----------------------------------------------------------------------------- tasks


def _check_reference(reference: Any) -> None:
    ok = reference is None or (isinstance(reference, dict) and all(
        isinstance(metrics, dict) and all(_is_number(v) for v in metrics.values())
        for metrics in reference.values()))
    _require(ok, "tasks.reference", reference, "null or {task: {metric: number}}, e.g. {t0: {mse: 0.5}}")


@dataclass
class ToyTasksConf:
    name: str = "toy"
    sigmas: list[float] = field(default_factory=lambda: [1.0, 100.0])
    n_train: int = 10000
    n_val: int = 1000
    n_test: int = 1000
    in_dim: int = 250
    out_dim: int = 100
    b_var: float = 10.0
    eps_var: float = 3.5
    data_seed: int = 0
    reference: Any = None  # single-task reference metrics {task: {metric: value}} for `mtl-bench report -b reference`

    def __post_init__(self) -> None:
        _check_reference(self.reference)
        _require(len(self.sigmas) > 0, "tasks.sigmas", self.sigmas, "one scale per task, at least one")
        for key in ("n_train", "n_val", "n_test", "in_dim", "out_dim"):
            _positive(f"tasks.{key}", getattr(self, key))


@dataclass
class DigitsTasksConf:
    name: str = "digits"
    n_train: int = 10000
    n_val: int = 2000
    n_test: int = 2000
    overlap: int = 4
    data_seed: int = 0
    reference: Any = None  # as tasks=toy

    def __post_init__(self) -> None:
        _check_reference(self.reference)
        for key in ("n_train", "n_val", "n_test"):
            _positive(f"tasks.{key}", getattr(self, key))
        _require(0 <= self.overlap <= 8, "tasks.overlap", self.overlap, "0..8 columns")


# ----------------------------------------------------------------------------- balancer


@dataclass
class FixedBalancerConf:
    name: str = "fixed"
    # task -> weight; null gives every task weight 1.0, otherwise every task needs one.
    # Typed Any: OmegaConf cannot replace a null typed dict, nor add keys to a typed empty one, from the CLI.
    weights: Any = None

    def __post_init__(self) -> None:
        _check_weights(self.weights)


def _check_weights(weights: Any) -> None:
    _require(weights is None or isinstance(weights, dict), "balancer.weights", weights,
             "null or a mapping task: weight, e.g. balancer.weights={t0:1.0,t1:0.5}")
    for task, w in (weights or {}).items():
        _require(_is_number(w), f"balancer.weights.{task}", w, "a number")
        _non_negative(f"balancer.weights.{task}", w)


@dataclass
class RescaledNormBalancerConf:
    """EnCodec's balancer (Défossez et al. 2022): each loss gets the share w_k/Σw of the gradient norm at `shared`."""

    name: str = "rescaled_norm"
    weights: Any = None  # as balancer=fixed: null gives every task 1.0
    rescale_grads: bool = True  # false: plain weighted sum (with monitor, still logs the ratios)
    total_norm: float = 1.0
    ema_decay: float = 0.999  # EMA of each loss's gradient norm, bias-corrected; 1.0 = plain mean
    per_batch_item: bool = True  # norm per batch item then averaged, else of the whole tensor
    epsilon: float = 1e-12
    monitor: bool = True  # log ratio/<task> (free when rescaling: the norms are measured anyway)

    def __post_init__(self) -> None:
        _check_weights(self.weights)
        _positive("balancer.total_norm", self.total_norm)
        _require(0 < self.ema_decay <= 1, "balancer.ema_decay", self.ema_decay, "0 < ema_decay <= 1")
        _non_negative("balancer.epsilon", self.epsilon)


GRADNORM_INITIAL_LOSSES = ("first_step", "theoretical")


@dataclass
class GradNormBalancerConf:
    """GradNorm (Chen et al. 2018): learnable weights that equalise the tasks' gradient norms."""

    name: str = "gradnorm"
    alpha: float = 1.5  # restoring force; the paper uses 0.12 on its toy regression, 1.5 on NYUv2
    lr: float = 0.025  # the weights' own optimizer
    optimizer: str = "adam"  # adam | sgd, for the weights
    grad_source: str = "last_shared"  # last_shared (the paper's W) | shared_rep (cheaper)
    # L_i(0): first_step = the first training step's losses (the paper); theoretical = each task's known
    # uninformed loss (log C for C-class cross-entropy); every task must have one
    initial_losses: str = "first_step"
    min_weight: float = 1e-6

    def __post_init__(self) -> None:
        _non_negative("balancer.alpha", self.alpha)
        _positive("balancer.lr", self.lr)
        _one_of("balancer.optimizer", self.optimizer, ("adam", "sgd"))
        _one_of("balancer.grad_source", self.grad_source, ("last_shared", "shared_rep"))
        _one_of("balancer.initial_losses", self.initial_losses, GRADNORM_INITIAL_LOSSES)
        _positive("balancer.min_weight", self.min_weight)


# ----------------------------------------------------------------------------- optim

SCHEDULES = ("none", "step", "multistep", "cosine", "eden", "eden2", "cyclic")


@dataclass
class ScheduleConf:
    """The learning-rate schedule, stepped once per optimizer step; only the keys of `name` are read."""

    name: str = "none"  # none | step | multistep | cosine | eden | eden2 | cyclic
    warmup_steps: int = 0  # linear warmup before any schedule but cyclic (eden/eden2: icefall's warmup)
    step_size: int = 1000  # step: multiply the lr by gamma every step_size steps after warmup
    gamma: float = 0.1  # step, multistep
    milestones: list[int] = field(default_factory=list)  # multistep: steps (after warmup) where lr *= gamma
    min_lr_ratio: float = 0.0  # cosine: final lr = min_lr_ratio * lr
    lr_batches: float = 7500.0  # eden, eden2: the batch count where the decay sets in (icefall zipformer)
    lr_epochs: float = 3.5  # eden: the same in epochs
    warmup_start: float = 0.5  # eden, eden2: the warmup starts at this fraction of the lr
    # cyclic (mmcv CyclicLrUpdater): lr goes from lr up to lr*target_ratio[0] over step_ratio_up of a cycle,
    # then down to lr*target_ratio[1]; momentum (SGD momentum, Adam beta1) moves the other way between
    # momentum*momentum_target_ratio[0] and momentum*momentum_target_ratio[1]; null keeps it fixed
    target_ratio: list[float] = field(default_factory=lambda: [10.0, 1e-4])
    cyclic_times: int = 1
    step_ratio_up: float = 0.4
    anneal_strategy: str = "cos"  # cos | linear
    momentum_target_ratio: Optional[list[float]] = field(default_factory=lambda: [0.85 / 0.95, 1.0])

    def __post_init__(self) -> None:
        _one_of("optim.schedule.name", self.name, SCHEDULES)
        _non_negative("optim.schedule.warmup_steps", self.warmup_steps)
        _positive("optim.schedule.step_size", self.step_size)
        _positive("optim.schedule.gamma", self.gamma)
        _require(all(m > 0 for m in self.milestones) and list(self.milestones) == sorted(self.milestones),
                 "optim.schedule.milestones", self.milestones, "increasing positive step counts")
        _require(self.name != "multistep" or len(self.milestones) > 0, "optim.schedule.milestones",
                 self.milestones, "multistep needs at least one milestone, e.g. [1000,2000]")
        _require(0 <= self.min_lr_ratio <= 1, "optim.schedule.min_lr_ratio", self.min_lr_ratio, "0..1")
        _positive("optim.schedule.lr_batches", self.lr_batches)
        _positive("optim.schedule.lr_epochs", self.lr_epochs)
        _require(0 <= self.warmup_start <= 1, "optim.schedule.warmup_start", self.warmup_start, "0..1")
        _require(len(self.target_ratio) == 2 and all(r > 0 for r in self.target_ratio),
                 "optim.schedule.target_ratio", self.target_ratio, "two positive ratios [up, end]")
        _positive("optim.schedule.cyclic_times", self.cyclic_times)
        _require(0 < self.step_ratio_up < 1, "optim.schedule.step_ratio_up", self.step_ratio_up, "0 < x < 1")
        _one_of("optim.schedule.anneal_strategy", self.anneal_strategy, ("cos", "linear"))
        _require(self.momentum_target_ratio is None or len(self.momentum_target_ratio) == 2,
                 "optim.schedule.momentum_target_ratio", self.momentum_target_ratio, "null or two ratios")
        _require(self.name != "cyclic" or self.warmup_steps == 0, "optim.schedule.warmup_steps",
                 self.warmup_steps, "0 with the cyclic schedule (its first phase is the warmup)")


def _check_paramwise(paramwise: Any) -> None:
    _require(paramwise is None or isinstance(paramwise, dict), "optim.paramwise", paramwise,
             "null or a mapping (custom_keys, bias_lr_mult, bias_decay_mult, norm_decay_mult, "
             "dwconv_decay_mult, bypass_duplicate)")


@dataclass
class SGDConf:
    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    schedule: ScheduleConf = field(default_factory=ScheduleConf)
    # mmcv paramwise_cfg: per-parameter lr/decay multipliers, e.g. {bias_decay_mult: 0, custom_keys: {head: {lr_mult: 10}}}
    paramwise: Any = None

    def __post_init__(self) -> None:
        _positive("optim.lr", self.lr)
        _require(0 <= self.momentum < 1, "optim.momentum", self.momentum, "0 <= momentum < 1")
        _require(not self.nesterov or self.momentum > 0, "optim.nesterov", self.nesterov,
                 "nesterov needs optim.momentum > 0")
        _non_negative("optim.weight_decay", self.weight_decay)
        _check_paramwise(self.paramwise)


@dataclass
class AdamConf:
    name: str = "adam"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.0
    # true: decoupled weight decay (AdamW, Loshchilov & Hutter 2019); false: L2 added to the gradient
    decoupled_weight_decay: bool = False
    schedule: ScheduleConf = field(default_factory=ScheduleConf)
    paramwise: Any = None  # as optim=sgd

    def __post_init__(self) -> None:
        _positive("optim.lr", self.lr)
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas", self.betas,
                 "two numbers in [0, 1)")
        _positive("optim.eps", self.eps)
        _non_negative("optim.weight_decay", self.weight_decay)
        _check_paramwise(self.paramwise)


@dataclass
class ScaledAdamConf:
    """icefall's ScaledAdam (zipformer optim.py); defaults as the zipformer recipe (base_lr 0.045, clipping 2.0)."""

    name: str = "scaled_adam"
    lr: float = 0.045
    clipping_scale: Optional[float] = 2.0  # clip to this times the median recent gradient norm; null: off
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    scalar_lr_scale: float = 0.1
    eps: float = 1e-8
    param_min_rms: float = 1e-5
    param_max_rms: float = 3.0
    scalar_max: float = 10.0
    size_update_period: int = 4
    clipping_update_period: int = 100
    compile: str = "auto"  # auto | true | false: run the update through torch.compile (auto: when it pays off)
    schedule: ScheduleConf = field(default_factory=lambda: ScheduleConf(name="eden", warmup_steps=500))
    paramwise: Any = None  # as optim=sgd (lr_mult only: decay_mult has nothing to act on)

    def __post_init__(self) -> None:
        _positive("optim.lr", self.lr)
        _require(self.clipping_scale is None or self.clipping_scale > 0, "optim.clipping_scale",
                 self.clipping_scale, "null or > 0")
        _require(len(self.betas) == 2 and 0 < self.betas[0] <= self.betas[1] < 1, "optim.betas", self.betas,
                 "two numbers with 0 < beta1 <= beta2 < 1")
        _positive("optim.eps", self.eps)
        _require(0 < self.param_min_rms < self.param_max_rms, "optim.param_min_rms", self.param_min_rms,
                 "0 < param_min_rms < param_max_rms")
        _positive("optim.size_update_period", self.size_update_period)
        _positive("optim.clipping_update_period", self.clipping_update_period)
        _one_of("optim.compile", str(self.compile).lower(), ("auto", "true", "false"))
        _check_paramwise(self.paramwise)


@dataclass
class CustomOptimConf:
    """Any optimizer class: a torch.optim name (RMSprop, NAdam, ...) or an import path `pkg.module.Class`."""

    name: str = "custom"
    class_path: str = "RMSprop"
    lr: float = 1e-3
    weight_decay: float = 0.0
    kwargs: Any = None  # more constructor arguments, e.g. {alpha: 0.9, momentum: 0.5}; null: none
    schedule: ScheduleConf = field(default_factory=ScheduleConf)
    paramwise: Any = None  # as optim=sgd

    def __post_init__(self) -> None:
        _positive("optim.lr", self.lr)
        _non_negative("optim.weight_decay", self.weight_decay)
        _require(self.kwargs is None or isinstance(self.kwargs, dict), "optim.kwargs", self.kwargs,
                 "null or a mapping of constructor arguments")
        _check_paramwise(self.paramwise)


# ----------------------------------------------------------------------------- precision


PRECISIONS = ("fp32", "fp16", "bf16")
GRAD_SCALER_KEYS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


@dataclass
class PrecisionConf:
    """fp32, or bf16 autocast (no scaler needed: bfloat16 has float32's exponent range)."""

    name: str = "fp32"

    def __post_init__(self) -> None:
        _one_of("precision.name", self.name, PRECISIONS)


def _check_loss_scale(value: Any) -> None:
    allowed = f"dynamic, a number > 0 (a static scale) or a mapping of {', '.join(GRAD_SCALER_KEYS)}"
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(GRAD_SCALER_KEYS))
        if unknown:
            raise ConfigError(f"precision.loss_scale.{unknown[0]}: no such key; allowed: {', '.join(GRAD_SCALER_KEYS)}")
        for key, number in value.items():
            _require(_is_number(number) and number > 0,
                     f"precision.loss_scale.{key}", number, "a number > 0")
        return
    _require(value == "dynamic" or (_is_number(value) and value > 0), "precision.loss_scale", value, allowed)


@dataclass
class Fp16PrecisionConf:
    """float16 autocast with a grad scaler (mmcv Fp16OptimizerHook's loss_scale forms)."""

    name: str = "fp16"
    # dynamic | a number (static scale; an int is fine) | {init_scale, growth_factor, backoff_factor, growth_interval}
    loss_scale: Any = "dynamic"

    def __post_init__(self) -> None:
        _one_of("precision.name", self.name, ("fp16",))
        _check_loss_scale(self.loss_scale)


# ----------------------------------------------------------------------------- trainer


@dataclass
class GradClipConf:
    """mmcv's grad_clip: by global norm (max_norm, norm_type) or by value; grad_norm/total is logged either way."""

    max_norm: Optional[float] = None  # null: no clipping by norm
    norm_type: float = 2.0
    clip_value: Optional[float] = None  # clamp every gradient element to [-clip_value, clip_value]

    def __post_init__(self) -> None:
        _require(self.max_norm is None or self.max_norm > 0, "trainer.grad_clip.max_norm", self.max_norm,
                 "null or > 0")
        _require(self.clip_value is None or self.clip_value > 0, "trainer.grad_clip.clip_value", self.clip_value,
                 "null or > 0")
        _require(self.max_norm is None or self.clip_value is None, "trainer.grad_clip", "max_norm and clip_value",
                 "one of max_norm or clip_value")
        _positive("trainer.grad_clip.norm_type", self.norm_type)


@dataclass
class TrainerConf:
    max_steps: int = 1000  # optimizer steps; ignored when epochs is set
    epochs: Optional[int] = None  # train for this many passes over the training split instead
    batch_size: int = 128
    eval_every: int = 250  # evaluate on val every N steps (and always at the end)
    log_every: int = 50  # read losses/weights from the device and log them every N steps
    checkpoint_every: int = 500  # save checkpoints/last.pt every N steps (and always at the end); 0 = only at the end
    resume: Optional[str] = None  # null | auto (this run dir's checkpoint, if any) | a checkpoint or run-dir path
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    num_threads: Optional[int] = None  # torch intra-op threads; null keeps torch's default
    progress: str = "auto"  # auto (bar on a terminal, log lines otherwise) | bar | log
    grad_clip: GradClipConf = field(default_factory=GradClipConf)
    # name, once, every trainable parameter that does not reach the loss (costs a graph walk per session)
    detect_anomalous_params: bool = False
    # joint: one batch carries every task's targets; per_task: one batch per task (its own sample stream),
    # forwarded and backpropagated in turn, gradients accumulate, one optimizer step
    step_mode: str = "joint"
    grad_accumulation_steps: int = 1  # loader steps per optimizer step; the gradient is their mean
    on_nonfinite: str = "skip"  # a non-finite loss: skip the step (counted, logged) | raise (stop, naming task/step)
    profile: bool = False  # write a torch profiler trace of a few steps (TensorBoard's profile tab)

    def __post_init__(self) -> None:
        _positive("trainer.max_steps", self.max_steps)
        _require(self.epochs is None or self.epochs > 0, "trainer.epochs", self.epochs, "null or > 0")
        for key in ("batch_size", "eval_every", "log_every"):
            _positive(f"trainer.{key}", getattr(self, key))
        _non_negative("trainer.checkpoint_every", self.checkpoint_every)
        _require(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
                 "trainer.device", self.device, "auto, cpu, cuda or cuda:N")
        _require(self.num_threads is None or self.num_threads > 0, "trainer.num_threads", self.num_threads,
                 "null or > 0")
        _one_of("trainer.progress", self.progress, ("auto", "bar", "log"))
        _one_of("trainer.step_mode", self.step_mode, ("joint", "per_task"))
        _positive("trainer.grad_accumulation_steps", self.grad_accumulation_steps)
        _one_of("trainer.on_nonfinite", self.on_nonfinite, ("skip", "raise"))


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


GROUP_SCHEMAS: dict[str, dict[str, type]] = {
    "model": {"mlp": MLPConf, "lenet": LeNetConf},
    "tasks": {"toy": ToyTasksConf, "digits": DigitsTasksConf},
    "balancer": {"fixed": FixedBalancerConf, "rescaled_norm": RescaledNormBalancerConf,
                 "gradnorm": GradNormBalancerConf},
    "optim": {"sgd": SGDConf, "adam": AdamConf, "scaled_adam": ScaledAdamConf,
              "custom": CustomOptimConf},
    "precision": {"fp32": PrecisionConf, "fp16": Fp16PrecisionConf, "bf16": PrecisionConf},
}


def register_configs() -> None:
    """Store every schema under `schema/<group>/<option>` (a name no YAML option uses)."""
    cs = ConfigStore.instance()
    cs.store(name="schema_run", node=RunConf)
    for group, options in GROUP_SCHEMAS.items():
        for option, schema in options.items():
            cs.store(group=f"schema/{group}", name=option, node=schema)


register_configs()
