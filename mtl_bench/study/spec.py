"""A study's config: `conf/study/<name>.yaml` (or any YAML path) with command-line overrides, checked against the
schema below. Every key is declared here once; an unknown key or a bad value is one line naming it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mtl_bench.catalog import conf_root
from mtl_bench.errors import ConfigError

# The two baselines every study has (issue 30): the task-weight search the re-evaluation papers found hard to beat,
# and equal weights; both with the learning rate tuned on the same budget as every method.
SCALARIZATION, EQUAL = "scalarization", "equal"
SINGLE_TASK = "single_task"
BUILT_IN = (EQUAL, SCALARIZATION)
REFERENCES = ("single_task", "published")
DISTRIBUTIONS = ("loguniform", "uniform", "choice")


@dataclass
class MethodConf:
    balancer: str = MISSING  # a balancer= option
    keys: dict[str, Any] = field(default_factory=dict)  # fixed overrides, e.g. {balancer.temperature: 2.0}
    space: dict[str, Any] = field(default_factory=dict)  # the method's own tuning keys, e.g. GradNorm's alpha


@dataclass
class StudyConf:
    name: str = MISSING
    about: str = ""  # which paper, table and code a preset follows, and how it differs
    experiment: list[str] = MISSING  # `mtl-bench train` overrides that compose every run of the study
    tasks: Optional[list[str]] = None  # the task set's task names; null: read from the task set once
    budget: int = 6  # tuning trials per method, per single-task baseline and for each built-in baseline
    tune_seed: int = 0
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])  # the final runs' seeds
    select: str = "delta_m"  # delta_m (validation Δm against the reference) | <task>/<metric> (on validation)
    reference: str = "single_task"  # single_task (runs the study makes) | published (the task set's reference)
    sampler_seed: int = 0
    space: dict[str, Any] = field(default_factory=lambda: {"optim.lr": {"loguniform": [1e-4, 1e-2]}})
    methods: dict[str, MethodConf] = field(default_factory=dict)
    dir: str = "outputs/study/${name}"  # the study directory
    launcher: list[str] = field(default_factory=list)  # hydra/launcher overrides; not part of the plan


def preset_path(name_or_path: str) -> Path:
    """A preset name (`digits`, `study=digits`) or a YAML path."""
    name = name_or_path.removeprefix("study=")
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"{name_or_path}: no such study file")
        return path
    preset = conf_root() / "study" / f"{name}.yaml"
    if not preset.is_file():
        raise ConfigError(f"study {name_or_path!r}: no such preset; presets: {', '.join(presets())}, or a .yaml path")
    return preset


def presets() -> list[str]:
    return sorted(p.stem for p in (conf_root() / "study").glob("*.yaml"))


def _unknown_key_message(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", "") or ""
    text = str(err).splitlines()[0]
    return f"{key}: {text}" if key and key not in text else text


def load_study(name_or_path: str, overrides: list[str]) -> DictConfig:
    """The study's config, its overrides applied (KEY=VALUE, values as YAML) and checked; a DictConfig in struct
    mode with every interpolation resolved."""
    path = preset_path(name_or_path)
    schema = OmegaConf.structured(StudyConf)
    try:
        loaded = OmegaConf.load(path)
        cfg = OmegaConf.merge(schema, loaded)
        for item in overrides:
            cfg = OmegaConf.merge(cfg, parse_override(item))
        OmegaConf.resolve(cfg)
        for method in cfg.methods.values():  # MISSING balancer
            method.balancer  # noqa: B018  (raises MissingMandatoryValue)
        cfg.experiment  # noqa: B018
    except ConfigError:
        raise
    except OmegaConfBaseException as err:
        raise ConfigError(f"study {path}: {_unknown_key_message(err)}") from None
    assert isinstance(cfg, DictConfig)
    check_study(cfg)
    return cfg


def plain(node: Any) -> dict[str, Any]:
    """A config mapping as a plain dict (interpolations resolved)."""
    data = OmegaConf.to_container(node, resolve=True)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


def parse_override(item: str) -> DictConfig:
    """KEY=VALUE in `mtl-bench train`'s syntax (Hydra's override grammar) as a config to merge. The config keys
    inside `space`, `methods.<m>.space` and `methods.<m>.keys` are dotted themselves: `space.optim.lr={...}` sets
    the key `optim.lr` of `space`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        override = OverridesParser.create().parse_override(item)
    except HydraException as err:
        raise ConfigError(f"{item!r}: {str(err).splitlines()[0]}") from None
    key = str(override.key_or_group)
    top = key.split(".")[0]
    if top not in study_keys():
        raise ConfigError(f"{key}: not a study key; keys: {', '.join(study_keys())}")
    parts = key.split(".")
    if top == "space" and len(parts) > 1:
        path = ["space", ".".join(parts[1:])]
    elif top == "methods" and len(parts) > 3 and parts[2] in ("space", "keys"):
        path = parts[:3] + [".".join(parts[3:])]
    else:
        path = parts
    node: Any = override.value()
    for part in reversed(path):
        node = {part: node}
    return OmegaConf.create(node)


def study_keys() -> list[str]:
    return list(StudyConf.__dataclass_fields__)


def check_study(cfg: DictConfig) -> None:
    if cfg.budget < 1:
        raise ConfigError(f"budget={cfg.budget}: must be >= 1 (trials per method)")
    if not cfg.seeds or len(set(cfg.seeds)) != len(cfg.seeds):
        raise ConfigError(f"seeds={list(cfg.seeds)}: give one or more distinct seeds")
    if cfg.reference not in REFERENCES:
        raise ConfigError(f"reference={cfg.reference}: allowed: {', '.join(REFERENCES)}")
    if cfg.select != "delta_m" and not re.fullmatch(r"[^/]+/[^/]+", cfg.select):
        raise ConfigError(f"select={cfg.select}: allowed: delta_m or <task>/<metric>")
    for name in cfg.methods:
        if name in (*BUILT_IN, SINGLE_TASK):
            raise ConfigError(f"methods.{name}: a built-in row of every study; name the method otherwise")
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
            raise ConfigError(f"methods.{name}: a method name is letters, digits, _ and -")
    check_space("space", cfg.space)
    for key in cfg.space:
        if key.startswith("balancer"):
            raise ConfigError(f"space.{key}: the shared space tunes what every method has; put it under a method")
    for name, method in cfg.methods.items():
        check_space(f"methods.{name}.space", method.space)
        for key in (*method["keys"], *method.space):
            if key in cfg.space or key == "seed":
                raise ConfigError(f"methods.{name}: {key} is tuned by the study (space) or set by it (seed)")


def check_space(where: str, space: Any) -> None:
    for key, dist in space.items():
        if not isinstance(dist, DictConfig) or len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
            raise ConfigError(
                f"{where}.{key}: one of {{loguniform: [lo, hi]}}, {{uniform: [lo, hi]}}, {{choice: [...]}}"
            )
        kind, args = str(next(iter(dist))), next(iter(dist.values()))
        if kind == "choice":
            if not args:
                raise ConfigError(f"{where}.{key}.choice: give one or more values")
            continue
        if len(args) != 2 or not all(isinstance(a, (int, float)) for a in args) or not args[0] < args[1]:
            raise ConfigError(f"{where}.{key}.{kind}: [lo, hi] with lo < hi, got {list(args)}")
        if kind == "loguniform" and args[0] <= 0:
            raise ConfigError(f"{where}.{key}.loguniform: lo must be > 0, got {args[0]}")


def plan_view(cfg: DictConfig) -> dict[str, Any]:
    """What fixes the study's runs: the config without where it runs (dir, launcher) and its prose."""
    return {k: v for k, v in plain(cfg).items() if k not in ("dir", "launcher", "about")}
