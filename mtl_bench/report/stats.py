"""Intervals over seeds and ranks among groups (the t quantile from scipy; no torch).

95% confidence interval of a mean over n distinct seeds (Student t, n − 1 degrees of freedom):

    mean ± t_{0.975, n−1} · s / √n,    s = √( Σ_i (x_i − mean)² / (n − 1) )

with x_i one value per seed (a seed's runs averaged first). With one seed there is no interval: "n/a".

Mean rank (as in the MTL benchmark tables): for each metric, the groups are ranked by their mean, 1 = best
(the metric's `higher_is_better` gives the direction); tied means share the mean of the ranks they span
(two groups tied for first are both 1.5). A group's mean rank is the mean of its ranks over the metrics;
lower is better.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

LEVEL = 0.95


def t_quantile(df: int, level: float = LEVEL) -> float:
    """t such that P(|T| ≤ t) = level for Student's T with `df` degrees of freedom (t_{0.975, df} for 0.95)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    from scipy.stats import t  # imported here: the report's import stays light

    return float(t.ppf((1 + level) / 2, df))


def ci_half_width(values: Sequence[float], level: float = LEVEL) -> float:
    """t_{(1+level)/2, n−1} · s / √n over one value per seed; nan with fewer than two values."""
    n = len(values)
    if n < 2:
        return math.nan
    return t_quantile(n - 1, level) * statistics.stdev(values) / math.sqrt(n)


def tied_ranks(values: Sequence[float], higher_is_better: bool) -> list[float]:
    """Rank 1 for the best value; ties get the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: -values[i] if higher_is_better else values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            ranks[i] = (start + end) / 2 + 1  # positions start..end hold ranks start+1..end+1
        start = end + 1
    return ranks


def mean_ranks(
    means: Sequence[dict[str, dict[str, float]]], higher_is_better: dict[str, dict[str, bool]]
) -> list[Optional[float]]:
    """Each group's mean rank over the metrics (task -> metric -> mean per group, in order).

    A metric is ranked among the groups that have a (non-nan) value for it; metrics of unknown direction are
    left out. A group with no ranked metric gets None.
    """
    columns = list(dict.fromkeys((task, name) for m in means for task, names in m.items() for name in names))
    per_group: list[list[float]] = [[] for _ in means]
    for task, name in columns:
        higher = higher_is_better.get(task, {}).get(name)
        if higher is None:
            continue
        present = [
            (i, m[task][name]) for i, m in enumerate(means) if name in m.get(task, {}) and not math.isnan(m[task][name])
        ]
        for (i, _), rank in zip(present, tied_ranks([v for _, v in present], higher)):
            per_group[i].append(rank)
    return [statistics.fmean(r) if r else None for r in per_group]
