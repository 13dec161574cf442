"""A study's config: `conf/study/<name>.yaml` (or any YAML path) with command-line overrides, checked against the
schema below. Every key is declared here once; an unknown key or a bad value is one line naming it."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mtl_bench.analysis.criterion import parse_criterion
from mtl_bench.catalog import conf_root
from mtl_bench.errors import ConfigError

# The two baselines every study has: the task-weight search the re-evaluation papers found hard to beat, and equal
# weights; both with the learning rate tuned on the same budget as every method.
SCALARIZATION, EQUAL = "scalarization", "equal"
SINGLE_TASK = "single_task"
BUILT_IN = (EQUAL, SCALARIZATION)
REFERENCES = ("single_task", "published")
DISTRIBUTIONS = ("loguniform", "uniform", "choice")
WEIGHT_SPACES = ("loguniform", "lattice", "dirichlet")


@dataclass
class ScalarizationConf:
    # loguniform: each task's weight log-uniform in `range` (LHS), then scaled to sum T; lattice: the simplex
    # lattice's interior points; dirichlet: Dirichlet(1) on the simplex. Every space adds equal weights as trial 0.
    weights: str = "loguniform"
    range: list[float] = field(default_factory=lambda: [0.1, 10.0])  # loguniform only: [lo, hi], lo > 0


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
    scalarization: ScalarizationConf = field(default_factory=ScalarizationConf)
    # The smallest paired Δm difference (percentage points) worth resolving: the verdict says whether the study
    # could have detected it (80% power) or how many seeds would.
    min_effect: float = 2.0
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
    message = f"{key}: {text}" if key and key not in text else text
    if key and "not in" in text:  # an unknown key: suggest the nearest known one of the same node
        node = _schema_of(key.split(".")[:-1])
        known = [f.name for f in fields(node)] if node else []
        close = difflib.get_close_matches(key.split(".")[-1], known, n=1)
        message += f"; did you mean {close[0]!r}?" if close else ""
    return message


def _schema_of(path: list[str]) -> Optional[type]:
    """The dataclass that holds the keys under `path` (methods.<name> is a MethodConf)."""
    if not path:
        return StudyConf
    if path == ["scalarization"]:
        return ScalarizationConf
    if len(path) == 2 and path[0] == "methods":
        return MethodConf
    return None


def load_study(name_or_path: str, overrides: list[str]) -> DictConfig:
    """The study's config, its overrides applied (KEY=VALUE, values as YAML) and checked; a DictConfig in struct
    mode with every interpolation resolved."""
    path = preset_path(name_or_path)
    schema = OmegaConf.structured(StudyConf)
    try:
        loaded = OmegaConf.load(path)
        cfg = OmegaConf.merge(schema, loaded)
        for item in overrides:
            cfg = apply_override(cfg, item)
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


def apply_override(cfg: Any, item: str) -> Any:
    """`cfg` with one override applied: KEY=VALUE sets (a mapping given to a top-level key such as `methods` replaces
    it: `methods={uw:{balancer:uw}}` keeps uw alone), ~KEY deletes (`~methods.dwa`), +KEY=VALUE adds. The syntax is
    `mtl-bench train`'s (Hydra's override grammar)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        override = OverridesParser.create().parse_override(item)
    except HydraException as err:
        raise ConfigError(f"{item!r}: {str(err).splitlines()[0]}") from None
    path = key_path(str(override.key_or_group))
    if override.is_delete():
        node = cfg
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, DictConfig) else None
        if not isinstance(node, DictConfig) or path[-1] not in node:
            raise ConfigError(f"~{'.'.join(path)}: no such key to delete")
        if path[0] != "methods" or len(path) != 2:
            raise ConfigError(f"~{'.'.join(path)}: only a method (~methods.<name>) can be deleted")
        del node[path[-1]]
        return cfg
    value: Any = override.value()
    if len(path) == 1 and path[0] in ("methods", "space") and isinstance(value, dict):
        cfg[path[0]] = {}  # a mapping given whole replaces the preset's
    for part in reversed(path):
        value = {part: value}
    return OmegaConf.merge(cfg, OmegaConf.create(value))


def key_path(key: str) -> list[str]:
    """A study key's path; the config keys inside `space`, `methods.<m>.space` and `methods.<m>.keys` are dotted
    themselves: `space.optim.lr` is the key `optim.lr` of `space`."""
    top = key.split(".")[0]
    if top not in study_keys():
        close = difflib.get_close_matches(top, study_keys(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{key}: not a study key; {hint}keys: {', '.join(study_keys())}")
    parts = key.split(".")
    if top == "space" and len(parts) > 1:
        return ["space", ".".join(parts[1:])]
    if top == "methods" and len(parts) > 3 and parts[2] in ("space", "keys"):
        return parts[:3] + [".".join(parts[3:])]
    return parts


def study_keys() -> list[str]:
    return list(StudyConf.__dataclass_fields__)


def check_study(cfg: DictConfig) -> None:
    if cfg.budget < 1:
        raise ConfigError(f"budget={cfg.budget}: must be >= 1 (trials per method)")
    if not cfg.seeds or len(set(cfg.seeds)) != len(cfg.seeds):
        raise ConfigError(f"seeds={list(cfg.seeds)}: give one or more distinct seeds")
    if cfg.tune_seed in cfg.seeds:
        raise ConfigError(
            f"seeds={list(cfg.seeds)}: contains tune_seed={cfg.tune_seed} (a final run would repeat the tuning run "
            "that won selection); give final seeds other than tune_seed"
        )
    weights = cfg.scalarization
    if weights.weights not in WEIGHT_SPACES:
        raise ConfigError(f"scalarization.weights={weights.weights}: allowed: {', '.join(WEIGHT_SPACES)}")
    lo_hi = list(weights.range)
    if len(lo_hi) != 2 or not 0 < lo_hi[0] < lo_hi[1]:
        raise ConfigError(f"scalarization.range={lo_hi}: [lo, hi] with 0 < lo < hi")
    if weights.weights != "loguniform" and lo_hi != ScalarizationConf().range:
        raise ConfigError(f"scalarization.range: read by weights=loguniform only, not {weights.weights}")
    if not cfg.min_effect > 0:
        raise ConfigError(f"min_effect={cfg.min_effect}: must be > 0 (percentage points of Δm)")
    if cfg.reference not in REFERENCES:
        raise ConfigError(f"reference={cfg.reference}: allowed: {', '.join(REFERENCES)}")
    parse_criterion(cfg.select, "select", per_task_only=True)
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
