"""Runs grouped by what was trained: mean, sample std and 95% CI over seeds of every final test metric, Δm with
its CI, the mean rank among groups and the training time per step.

A group is every completed run with the same resolved config (`.hydra/config.yaml`) once the seed and the
keys that do not change what is trained (analysis.runs.NOT_TRAINING_KEYS: resume, logging intervals,
device, ...) are left out: the defaults, `optim=adam balancer=fixed` and a resumed run of the defaults are
one group. A run without that file falls back to its command-line overrides (minus the same keys).
Groups are labelled by the keys whose values differ between them. Failed, diverged and incomplete runs
are never averaged: `describe_problems` lists them with their reason. Intervals and ranks: analysis/stats.py.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from mtl_bench.analysis.delta_m import delta_m_flat, delta_m_task_averaged, relative_drops
from mtl_bench.analysis.runs import Run, is_training_key, override_key, run_reason
from mtl_bench.analysis.stats import ci_half_width, mean_ranks, merge_directions
from mtl_bench.errors import ConfigError

SEED_KEYS = ("seed",)
LOSS = "loss"  # reported by every task; Δm and the table use the task metrics (mse, accuracy, ...)
_ABSENT = ("<absent>",)  # a key a group does not have (compares unequal to every config value)


def varied_overrides(run: Run) -> list[str]:
    """The run's command-line overrides without the seed, as typed (how a failed or killed run is named)."""
    return [item for item in run.record.overrides if override_key(item) not in SEED_KEYS]


def training_overrides(run: Run) -> list[str]:
    """The run's overrides that change what is trained (no seed, resume, logging interval, ...), sorted."""
    return sorted(item for item in run.record.overrides if is_training_key(override_key(item)))


def _freeze(value: Any) -> Any:
    """A hashable stand-in for a config value (lists and dicts as tuples; 1 and 1.0 stay equal)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    return value


def format_value(value: Any) -> str:
    """A config value as it would be typed on the command line: null, true, [1.0,100.0], 0.001."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _config_view(run: Run, config: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """The run's training config with each config group's choice (`balancer` -> `fixed`) placed before its keys,
    and the keys that are such choices."""
    choices = {k.replace("/", "."): v for k, v in run.choices.items()}
    view: dict[str, Any] = {}
    for key, value in config.items():
        parts = key.split(".")
        for i in range(1, len(parts)):
            node = ".".join(parts[:i])
            if node in choices and node not in view:
                view[node] = choices[node]
        view[key] = value
    return view, {node for node in choices if node in view}


@dataclass
class Stat:
    mean: float
    std: float  # sample standard deviation over seeds (runs of one seed averaged first); nan with one seed
    n: int  # seeds
    # half-width of the 95% confidence interval (Student t over seeds); nan with one seed, and nan where the
    # interval would reach below zero for a quantity none of whose values is negative (`below_zero`)
    ci: float = math.nan
    values: list[float] = field(default_factory=list, repr=False)  # one per seed
    below_zero: bool = False  # the interval was dropped: mean − CI < 0 for values that are all >= 0

    @classmethod
    def of(cls, values: list[float]) -> "Stat":
        """mean, sample std and 95% CI over one value per seed. Student t's interval is symmetric: with few seeds
        and a wide spread it reaches below zero for a quantity that cannot be negative (time per step, an error;
        `2730 ± 25000` ms with 2 seeds), which says nothing about it, so none is given ("n/a") there."""
        std = statistics.stdev(values) if len(values) > 1 else math.nan
        mean, ci = statistics.fmean(values), ci_half_width(values)
        below = not math.isnan(ci) and min(values) >= 0 and mean - ci < 0
        return cls(mean, std, len(values), math.nan if below else ci, list(values), below)


@dataclass
class Group:
    label: str  # the keys whose values tell this group from the others (see group_runs)
    settings: dict[str, Any]  # config-group choices and resolved config keys: what --baseline is matched on
    identity: dict[str, Any]  # what was trained (the resolved config, or the overrides): the group's key
    runs: list[Run]
    stats: dict[str, dict[str, Stat]] = field(default_factory=dict)  # task -> metric -> Stat
    higher_is_better: dict[str, dict[str, bool]] = field(default_factory=dict)
    delta_m: Optional[dict[str, float]] = None  # {"flat": ..., "task_averaged": ...} against the baseline
    delta_m_ci: Optional[dict[str, float]] = None  # the same keys: 95% CI half-width over seeds (nan: one seed)
    baseline_label: Optional[str] = None
    mean_rank: Optional[float] = None  # over the metrics, among the groups of the same task set (1 = best)
    time_per_step: Optional[Stat] = None  # seconds per optimizer step over seeds; None when no run recorded it
    peak_memory: Optional[dict[str, Any]] = None  # the largest run's metrics.json `peak_memory` (bytes, label)
    per_seed: dict[Any, dict[str, dict[str, float]]] = field(default_factory=dict, repr=False)  # seed -> metrics
    view: dict[str, Any] = field(default_factory=dict, repr=False)  # what labels are made of, in config order
    choice_keys: set[str] = field(default_factory=set, repr=False)  # keys of `view` that are group choices
    overridden: set[str] = field(default_factory=set, repr=False)  # keys its runs set on the command line
    terms: list[str] = field(default_factory=list, repr=False)  # the label's `key=value` terms
    tags: list[str] = field(default_factory=list)  # its runs' labels (`tag=...`, `tag.<name>=...`), distinct
    is_baseline: bool = False  # the group Δm is taken against (its own Δm is 0 by definition: shown as "baseline")

    @property
    def means(self) -> dict[str, dict[str, float]]:
        return {task: {name: s.mean for name, s in metrics.items()} for task, metrics in self.stats.items()}

    @property
    def seeds(self) -> int:
        """Distinct seeds among the group's runs (a run whose seed is unknown counts as its own)."""
        return len({_seed_of(run) for run in self.runs})

    @property
    def count(self) -> str:
        """ "3" for three runs of three seeds, "3 runs, 1 seed" when seeds repeat."""
        n, seeds = len(self.runs), self.seeds
        return str(seeds) if n == seeds else f"{n} runs, {seeds} seed{'s' if seeds != 1 else ''}"


def run_tags(run: Run) -> str:
    """The run's `tag` as typed (`tag=first`, `tag.lab=ours tag.round=2`), from its config, else its overrides; ""
    without one. Not a training key: runs that differ only in it are one group, which lists every tag it saw."""
    if run.config is not None and "tag" in run.config:
        value = run.config["tag"]
        if value is None:
            return ""
        if isinstance(value, dict):
            return " ".join(f"tag.{k}={format_value(v)}" for k, v in value.items())
        return f"tag={format_value(value)}"
    return " ".join(item.lstrip("+") for item in run.record.overrides if override_key(item).split(".")[0] == "tag")


def _seed_of(run: Run) -> Any:
    seed = run.seed
    return ("run", str(run.path)) if seed is None else seed


def _bucket(run: Run) -> tuple[Any, ...]:
    """What two runs must share to be one group."""
    config = run.training_config()
    if config is not None:
        return ("config", tuple(sorted(((k, _freeze(v)) for k, v in config.items()), key=lambda kv: kv[0])))
    return ("overrides", tuple(training_overrides(run)))


def summarise(runs: list[Run]) -> Group | None:
    """One group's statistics: each seed's runs averaged, then mean ± sample std over seeds."""
    completed = [r for r in runs if r.record.completed]
    if not completed:
        return None
    first = completed[0]
    stats: dict[str, dict[str, Stat]] = {}
    per_seed: dict[Any, dict[str, dict[str, float]]] = {}
    for task, metrics in first.record.split("test").items():
        for name in metrics:
            if name == LOSS and len(metrics) > 1:
                continue
            runs_of_seed: dict[Any, list[float]] = {}
            for run in completed:
                test = run.record.split("test")
                if name in test.get(task, {}):
                    runs_of_seed.setdefault(_seed_of(run), []).append(test[task][name])
            for seed, values in runs_of_seed.items():
                per_seed.setdefault(seed, {}).setdefault(task, {})[name] = statistics.fmean(values)
            stats.setdefault(task, {})[name] = Stat.of([statistics.fmean(v) for v in runs_of_seed.values()])
    times: dict[Any, list[float]] = {}
    for run in completed:
        if run.time_per_step_s is not None:
            times.setdefault(_seed_of(run), []).append(run.time_per_step_s)
    time_per_step = Stat.of([statistics.fmean(v) for v in times.values()]) if times else None
    peaks = [r.record.peak_memory for r in completed if isinstance(r.record.peak_memory, dict)]
    peak_memory = max(peaks, key=lambda p: p.get("bytes", 0)) if peaks else None

    overridden = {override_key(item) for run in completed for item in training_overrides(run)}
    config = first.training_config()
    choices = {k.replace("/", "."): v for k, v in first.choices.items()}
    if config is not None:
        view, choice_keys = _config_view(first, config)
        settings = {**view, **{k: v for k, v in choices.items() if k not in view}}
        identity = config
    else:  # no .hydra/config.yaml: today's rule, the overrides (and choices, for --baseline)
        view = {override_key(item): item.split("=", 1)[1] for item in training_overrides(first) if "=" in item}
        choice_keys = set()
        settings = identity = {**choices, **view}
    return Group(
        "",
        settings,
        identity,
        completed,
        stats,
        first.record.higher_is_better or {},
        time_per_step=time_per_step,
        peak_memory=peak_memory,
        per_seed=per_seed,
        view=view,
        choice_keys=choice_keys,
        overridden=overridden,
        tags=sorted({run_tags(run) for run in completed} - {""}),
    )


def _under(key: str, node: str) -> bool:
    return key.startswith(node + ".")


def label_groups(groups: list[Group]) -> None:
    """Label each group by the keys whose values differ between groups, as short `key=value` text.

    A config group whose option differs (`balancer=gradnorm` against `balancer=fixed`) is named by its option, and
    the keys under it only where they differ between groups with that same option. A value is left out where it is
    the default of the others: the one value of that key among the groups (with the same options) whose runs did not
    set it on the command line. So labels read like the commands that made the runs, and a group that has the
    defaults wherever the others change something is "(defaults)".
    """
    if len(groups) == 1:
        group = groups[0]
        shared = [
            item
            for item in training_overrides(group.runs[0])
            if all(item in training_overrides(run) for run in group.runs[1:])
        ]
        group.terms = shared
        group.label = " ".join(shared) or "(defaults)"
        return
    keys = list(dict.fromkeys(key for group in groups for key in group.view))
    choices = set().union(*(g.choice_keys for g in groups))

    def values(key: str, among: list[Group]) -> set[Any]:
        return {_freeze(g.view.get(key, _ABSENT)) for g in among}

    def overrides(group: Group, key: str) -> bool:  # `balancer=gradnorm` sets the option, not balancer.alpha
        return any(key == k or (_under(key, k) and k not in choices) for k in group.overridden)

    differing = {key for key in keys if len(values(key, groups)) > 1}
    # an option counts only when something trained under it differs (`trainer=smoke` vs default + max_steps=20: same)
    switched = {node for node in differing & choices if any(_under(key, node) for key in differing)}
    differing = (differing - choices) | switched
    for group in groups:
        terms = []
        for key in keys:
            if key not in differing or key not in group.view:
                continue
            above = [node for node in switched if _under(key, node)]
            peers = [g for g in groups if all(g.view.get(node, _ABSENT) == group.view.get(node) for node in above)]
            if not overrides(group, key) and len(values(key, peers)) == 1:
                continue  # the option's own value: implied by the option's name
            default = values(key, [g for g in peers if not overrides(g, key)])
            if len(default) == 1 and _freeze(group.view[key]) in default:
                continue  # what the groups that did not set it have
            shown = key.replace(".", "/") if key in choices else key  # a group's option as typed: model/arch=mmoe
            terms.append(f"{shown}={format_value(group.view[key])}")
        group.terms = terms
        group.label = " ".join(terms) or "(defaults)"
    seen: dict[str, int] = {}
    for group in groups:  # two labels coincide only through keys some groups lack; keep them apart anyway
        seen[group.label] = seen.get(group.label, 0) + 1
    for group in groups:
        if seen[group.label] > 1:
            group.label += f" [{group.runs[0].path.name}]"


def group_runs(runs: list[Run]) -> tuple[list[Group], list[str]]:
    """Completed runs grouped by what was trained, in the order their first run was found.

    Returns the groups, labelled by the keys that differ between them, and the training overrides that every
    completed run shares (listed once under the table).
    """
    buckets: dict[tuple[Any, ...], list[Run]] = {}
    for run in runs:
        if run.record.completed:
            buckets.setdefault(_bucket(run), []).append(run)
    groups = [g for g in (summarise(rs) for rs in buckets.values()) if g is not None]
    label_groups(groups)
    rank_groups(groups)
    common: list[str] = []
    if len(groups) > 1:
        every = [training_overrides(run) for group in groups for run in group.runs]
        common = [item for item in every[0] if all(item in other for other in every[1:])]
    return groups, common


def rank_groups(groups: list[Group]) -> None:
    """Each group's mean rank over its metrics among the groups of its task set (stats.mean_ranks)."""
    for part in by_task_set(groups).values():
        directions = merge_directions(group.higher_is_better for group in part)
        for group, rank in zip(part, mean_ranks([g.means for g in part], directions)):
            group.mean_rank = rank


def by_task_set(groups: list[Group]) -> dict[str, list[Group]]:
    """Groups split by the task set they trained on (one table and one set of plots each)."""
    parts: dict[str, list[Group]] = {}
    for group in groups:
        parts.setdefault(str(group.settings.get("tasks", "+".join(group.stats))), []).append(group)
    return parts


def parse_baseline(text: str) -> dict[str, str]:
    """`balancer=fixed` (or several, space or comma separated) -> {"balancer": "fixed"}; `reference` -> {}."""
    if text == "reference":
        return {}
    pairs = [item for item in text.replace(",", " ").split() if item]
    if not pairs or not all("=" in item for item in pairs):
        raise ConfigError(f"--baseline {text!r}: expected key=value (e.g. balancer=fixed) or 'reference'")
    return {override_key(key): value for key, value in (item.split("=", 1) for item in pairs)}


def matches(value: Any, text: str) -> bool:
    """Whether a resolved value is what `key=text` asks for (`optim.lr=1e-3` matches 0.001)."""
    if value is _ABSENT:
        return False
    if format_value(value) == text or str(value) == text:
        return True
    if value is None:
        return text.lower() in {"null", "none", "~"}
    if isinstance(value, bool):
        return text.lower() in ({"true", "yes", "on"} if value else {"false", "no", "off"})
    try:
        return float(value) == float(text)
    except (TypeError, ValueError):
        pass
    if isinstance(value, (list, dict)):
        import yaml

        try:
            return _freeze(yaml.safe_load(text)) == _freeze(value)
        except yaml.YAMLError:
            return False
    return False


def _without(values: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """Drop the selected keys and everything under them (`balancer` drops `balancer.alpha` too)."""
    return {k: _freeze(v) for k, v in values.items() if not any(k == key or _under(k, key) for key in keys)}


def find_baseline(group: Group, groups: list[Group], selector: dict[str, str]) -> Group | None:
    """The group that trained what `group` trained except in the selected keys, which it has at the selected values."""
    keys = list(selector)
    wanted = _without(group.identity, keys)
    for candidate in groups:
        if (
            all(matches(candidate.settings.get(k, _ABSENT), v) for k, v in selector.items())
            and _without(candidate.identity, keys) == wanted
        ):
            return candidate
    return None


def add_delta_m(groups: list[Group], baseline: str) -> None:
    """Fill each group's Δm against its baseline group, or against the task set's reference values, and its 95% CI:
    Δm of each seed's metrics against the baseline's means, mean ± t_{0.975, n−1} · s / √n over the n seeds (the
    baseline is held fixed; "n/a" with one seed)."""
    selector = parse_baseline(baseline)
    matched = False
    for group in groups:
        if not selector:  # single-task reference values from the task set's config
            reference = group.runs[0].record.reference
            if not reference:
                continue
            set_delta_m(group, reference, "reference")
        else:
            base = find_baseline(group, groups, selector)
            if base is None:
                continue
            set_delta_m(group, base.means, base.label)
            group.is_baseline = base is group
        matched = True
    if not matched:
        what = "reference values (tasks.reference)" if not selector else f"a group with {baseline}"
        raise ConfigError(f"--baseline {baseline}: no run has {what} to compare with")


def set_delta_m(group: Group, base_means: dict[str, dict[str, float]], label: str) -> None:
    """The group's Δm against `base_means` in both conventions, and its 95% CI over seeds."""
    group.baseline_label = label
    drops = relative_drops(group.means, base_means, group.higher_is_better)
    group.delta_m = {"flat": delta_m_flat(drops), "task_averaged": delta_m_task_averaged(drops)}
    # the interval: Δm of each seed's metrics against the baseline's means (held fixed: the baseline's own
    # spread over seeds is not in it), Student t over those per-seed values
    seeds = [relative_drops(metrics, base_means, group.higher_is_better) for metrics in group.per_seed.values()]
    group.delta_m_ci = {
        key: ci_half_width([v for v in map(convention, seeds) if not math.isnan(v)])
        for key, convention in (("flat", delta_m_flat), ("task_averaged", delta_m_task_averaged))
    }


def describe_problems(runs: list[Run]) -> list[dict[str, Any]]:
    """Failed, diverged and incomplete runs with their reason: listed apart, never averaged."""
    return [
        {
            "path": str(r.path),
            "status": r.record.status_name,
            "reason": run_reason(r),
            "overrides": " ".join(varied_overrides(r)),
        }
        for r in runs
        if not r.record.completed
    ]
