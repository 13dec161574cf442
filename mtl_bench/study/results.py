"""A study's results (study.json): per row, test Δm over the final seeds against the reference, the difference to
tuned scalarization paired by seed with Holm-corrected p-values and the smallest difference the seeds could detect,
mean rank, the outcome of every final run, time per step, peak memory and the compute it took (tuning + final
runs). No torch: the report reads it."""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Optional, Sequence

from mtl_bench.analysis.delta_m import delta_m_flat, relative_drops
from mtl_bench.analysis.stats import (
    ALPHA,
    POWER,
    detectable_difference,
    holm,
    mean_ci,
    mean_ranks,
    merge_directions,
    paired_difference,
    seeds_needed,
    separated,
)
from mtl_bench.records import RunRecord, Status
from mtl_bench.study.plan import FINAL, TUNE
from mtl_bench.study.spec import SCALARIZATION, SINGLE_TASK
from mtl_bench.study.tuning import without_loss

Metrics = dict[str, dict[str, float]]


def mean_metrics(records: Sequence[RunRecord], split: str) -> Metrics:
    """The mean over runs of each task metric of `split` (without losses)."""
    values: dict[str, dict[str, list[float]]] = {}
    for record in records:
        for task, metrics in without_loss(record.split(split)).items():
            for name, value in metrics.items():
                values.setdefault(task, {}).setdefault(name, []).append(float(value))
    return {task: {name: statistics.fmean(v) for name, v in ms.items()} for task, ms in values.items()}


def delta_m(record: RunRecord, reference: Metrics) -> float:
    return delta_m_flat(relative_drops(without_loss(record.split("test")), reference, record.higher_is_better or {}))


def run_compute(record: RunRecord) -> tuple[float, str]:
    """(hours of the unit, unit): a CPU run's training wall time times its threads (core-hours); a GPU run's wall
    time (GPU-hours, one GPU per run)."""
    wall = float(record.wall_time_s or 0.0)
    if record.device == "cuda":
        return wall / 3600, "GPU-hours"
    return wall * int(record.threads or 1) / 3600, "core-hours"


def _finite(x: float) -> Optional[float]:
    return None if math.isnan(x) else x


def summarize(
    index: list[dict[str, Any]],
    records: Mapping[str, Optional[RunRecord]],
    *,
    reference_kind: str,
    reference_test: Optional[Metrics],
    rows: list[str],
    seeds: list[int],
    not_learned: Optional[Mapping[str, str]] = None,
    min_effect: float = 2.0,
) -> dict[str, Any]:
    """`index`: every planned run (id, phase, row, seed); `records`: id -> metrics.json (None: not there);
    `not_learned`: id -> why, for the completed final runs that did not learn (they count, flagged)."""
    not_learned = not_learned or {}
    completed = {i: r for i, r in records.items() if r and r.completed}
    by_row: dict[str, dict[int, RunRecord]] = {}
    outcomes: dict[str, dict[str, str]] = {}
    compute: dict[str, dict[str, float]] = {}
    unit = "core-hours"
    for run in index:
        record = records.get(run["id"])
        if record:
            hours, unit = run_compute(record)
            key = SINGLE_TASK if run["row"].startswith(SINGLE_TASK) else run["row"]
            spent = compute.setdefault(key, {TUNE: 0.0, FINAL: 0.0})
            spent[run["phase"]] += hours
        if run["phase"] != FINAL:
            continue
        if run["id"] in completed:
            by_row.setdefault(run["row"], {})[run["seed"]] = completed[run["id"]]
        status = "did not learn" if run["id"] in not_learned else record.status_name if record else "not run"
        if status != Status.COMPLETED:
            outcomes.setdefault(run["row"], {})[str(run["seed"])] = status
    table: dict[str, dict[str, Any]] = {}
    if reference_test:
        for row in rows:
            done = by_row.get(row, {})
            per_seed = {s: delta_m(done[s], reference_test) for s in seeds if s in done}
            mean, ci = mean_ci(list(per_seed.values()))
            times = [r.wall_time_s / r.step for r in done.values() if r.step and r.wall_time_s is not None]
            peaks = [r.peak_memory for r in done.values() if isinstance(r.peak_memory, Mapping)]
            table[row] = {
                "delta_m": {"mean": _finite(mean), "ci95": _finite(ci), "n": len(per_seed)},
                "delta_m_per_seed": {str(s): v for s, v in per_seed.items()},
                "seeds_planned": len(seeds),
                "outcomes": outcomes.get(row, {}),
                "test_mean": mean_metrics(list(done.values()), "test"),
                "time_per_step_ms": _finite(1000 * mean_ci(times)[0]) if times else None,
                "peak_memory_mib": max(p["bytes"] for p in peaks) / 2**20 if peaks else None,
                "peak_memory_kind": peaks[0]["label"] if peaks else None,
            }
        add_paired(table, rows, seeds)
        hib = merge_directions(r.higher_is_better for r in completed.values())
        ranked = [row for row in rows if table[row]["test_mean"]]
        for row, rank in zip(ranked, mean_ranks([table[r]["test_mean"] for r in ranked], hib)):
            table[row]["mean_rank"] = rank
    for row, spent in compute.items():
        table.setdefault(row, {})["compute"] = {**spent, "total": spent[TUNE] + spent[FINAL], "unit": unit}
    power = power_summary(table, rows, min_effect)
    return {
        "reference": {"kind": reference_kind, "test": reference_test},
        "rows": table,
        "power": power,
        "verdict": verdict(table, rows, power),
        "compute_unit": unit,
    }


def add_paired(table: dict[str, dict[str, Any]], rows: list[str], seeds: list[int]) -> None:
    """Each row's per-seed difference to tuned scalarization over the seeds both have, with Holm over the rows, and
    the smallest difference those seeds could detect at Holm's strictest level."""
    base = table.get(SCALARIZATION, {}).get("delta_m_per_seed", {})
    compared = [row for row in rows if row != SCALARIZATION]
    diffs = {}
    for row in compared:
        mine = table[row]["delta_m_per_seed"]
        common = [str(s) for s in seeds if str(s) in mine and str(s) in base]
        if common:
            diffs[row] = paired_difference([mine[s] for s in common], [base[s] for s in common])
    adjusted = dict(zip(diffs, holm([d.p for d in diffs.values()])))
    family = sum(1 for d in diffs.values() if not math.isnan(d.p))
    alpha = ALPHA / max(family, 1)
    for row, diff in diffs.items():
        table[row]["vs_scalarization"] = {
            "mean": _finite(diff.mean),
            "ci95": _finite(diff.ci),
            "p": _finite(diff.p),
            "p_holm": _finite(adjusted[row]),
            "n": diff.n,
            "sd": _finite(diff.sd),
            "alpha": alpha,
            "detectable": _finite(detectable_difference(diff.sd, diff.n, alpha)),
            "separated": separated(diff, adjusted[row]),
        }


def power_summary(table: Mapping[str, Mapping[str, Any]], rows: list[str], min_effect: float) -> dict[str, Any]:
    """The study's power: the largest of the comparisons' detectable differences, and the seeds that would detect
    `min_effect` in the comparison with the largest spread."""
    compared = [table[r]["vs_scalarization"] for r in rows if "vs_scalarization" in table.get(r, {})]
    detectable = [c["detectable"] for c in compared]
    spreads = [c for c in compared if c.get("sd") is not None]
    widest = max(spreads, key=lambda c: c["sd"], default=None)
    return {
        "level": POWER,
        "min_effect": min_effect,
        "detectable_max": max(detectable) if detectable and None not in detectable else None,
        "seeds_for_min_effect": (
            _finite(seeds_needed(min_effect, widest["sd"], widest["alpha"])) if widest is not None else None
        ),
    }


def verdict(table: Mapping[str, Mapping[str, Any]], rows: list[str], power: Mapping[str, Any]) -> str:
    """The study's one-line conclusion; `power`: power_summary's result for the same table."""
    better = [r for r in rows if table.get(r, {}).get("vs_scalarization", {}).get("separated") == -1]
    worse = [r for r in rows if table.get(r, {}).get("vs_scalarization", {}).get("separated") == 1]
    tail = f"; worse with separation: {', '.join(worse)}" if worse else ""
    if not any("vs_scalarization" in table.get(r, {}) for r in rows):
        return "verdict: no paired comparison (tuned scalarization or the methods have no completed final runs)"
    if better:
        return (
            "verdict: beat tuned scalarization with separation (95% CI of the paired difference below 0, Holm p < "
            f"0.05): {', '.join(better)}{tail}"
        )
    largest, seeds, min_effect = power["detectable_max"], power["seeds_for_min_effect"], power["min_effect"]
    if largest is None:
        return (
            "verdict: inconclusive: no method separated from tuned scalarization, and with fewer than 2 paired "
            f"seeds (or no spread) the study cannot say what it could have detected{tail}"
        )
    if largest <= min_effect:
        return (
            f"verdict: no method beat tuned scalarization by more than {largest:.2f} Δm points (a difference that "
            f"large is detected with {100 * POWER:.0f}% power at Holm's level){tail}"
        )
    need = f"about {seeds:.0f} seeds" if seeds is not None else "more seeds"
    return (
        f"verdict: inconclusive: no method separated from tuned scalarization, but with these seeds only differences "
        f"of {largest:.2f} Δm points or more are detected with {100 * POWER:.0f}% power; {need} would resolve a "
        f"difference of {min_effect:g} points (min_effect){tail}"
    )
