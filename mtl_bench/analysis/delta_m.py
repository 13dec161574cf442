"""Δm (Maninis et al. CVPR 2019, as in Navon et al. ICML 2022 Nash-MTL; LibMTL: Lin & Zhang JMLR 2023).

The relative multi-task performance drop against a baseline, in its two published conventions.

flat (Maninis et al. 2019; as reported by Nash-MTL, CAGrad, FAMO): the mean over all K metrics,
    Δm = (100/K) Σ_k (−1)^{h_k} (M_k − B_k) / B_k
task-averaged (LibMTL, Lin & Zhang 2023): the same relative drops averaged within each task first,
    Δm = (100/T) Σ_t (1/K_t) Σ_{k∈t} (−1)^{h_k} (M_k − B_k) / B_k
with h_k = 1 when higher is better. Lower is better for both; 0 is the baseline itself.
"""

from __future__ import annotations

from typing import Mapping

Metrics = Mapping[str, Mapping[str, float]]  # task -> metric -> value
HigherIsBetter = Mapping[str, Mapping[str, bool]]


def relative_drops(values: Metrics, baseline: Metrics, higher_is_better: HigherIsBetter) -> dict[str, dict[str, float]]:
    """(−1)^{h_k} (M_k − B_k) / B_k · 100 for every metric present in both; a drop is positive."""
    drops: dict[str, dict[str, float]] = {}
    for task, metrics in values.items():
        for name, value in metrics.items():
            base = baseline.get(task, {}).get(name)
            higher = higher_is_better.get(task, {}).get(name)
            if base is None or base == 0 or higher is None:  # no baseline, or no known direction
                continue
            sign = -1.0 if higher else 1.0
            drops.setdefault(task, {})[name] = 100.0 * sign * (value - base) / base
    return drops


def delta_m_flat(drops: Mapping[str, Mapping[str, float]]) -> float:
    flat = [d for metrics in drops.values() for d in metrics.values()]
    return sum(flat) / len(flat) if flat else float("nan")


def delta_m_task_averaged(drops: Mapping[str, Mapping[str, float]]) -> float:
    per_task = [sum(metrics.values()) / len(metrics) for metrics in drops.values() if metrics]
    return sum(per_task) / len(per_task) if per_task else float("nan")
