"""Statistics over seeds, from scipy and statsmodels (no torch): the t interval, paired tests with Holm's
correction and their power, and ranks among groups.

95% confidence interval of a mean over n distinct seeds (Student t, n − 1 degrees of freedom; scipy.stats.t):

    mean ± t_{0.975, n−1} · s / √n,    s = √( Σ_i (x_i − mean)² / (n − 1) )

with x_i one value per seed (a seed's runs averaged first). With one seed there is no interval: "n/a".

A study compares a method with tuned scalarization over the final seeds s = 1..n:
  d_s = Δm_method(s) − Δm_scalarization(s)    paired by seed (same seed: same initialisation and data order)
  mean(d) ± t_{0.975, n-1} · sd(d)/√n, p from the paired t test (scipy.stats.ttest_rel, two-sided)
  Holm's step-down correction of the p-values over the methods compared (Holm 1979;
  statsmodels.stats.multitest.multipletests(method="holm")).
Power of the paired t test (statsmodels.stats.power.TTestPower, the one-sample t test on the differences):
  the smallest mean difference detectable with probability POWER at level α is d* · sd(d), where d* is the
  standardised effect TTestPower solves for with n and α; the seeds that would detect a difference δ solve the same
  equation for n with effect δ / sd(d). α is Holm's strictest level, ALPHA / m over the m methods compared: the level
  a lone true difference faces (Holm tests the smallest p at ALPHA / m first).

Mean rank (as in the MTL benchmark tables): for each metric, the groups are ranked by their mean, 1 = best
(the metric's `higher_is_better` gives the direction); tied means share the mean of the ranks they span
(two groups tied for first are both 1.5). A group's mean rank is the mean of its ranks over the metrics;
lower is better.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from mtl_bench.errors import ConfigError

LEVEL = 0.95
ALPHA = 0.05
POWER = 0.8


def require_libraries() -> None:
    """Before a study trains anything: the statistics it ends with need scipy and statsmodels."""
    import importlib

    for name in ("scipy.stats", "statsmodels.stats.multitest", "statsmodels.stats.power"):
        try:
            importlib.import_module(name)
        except ImportError:
            package = name.split(".")[0]
            raise ConfigError(
                f"mtl-bench study needs {package}, a dependency missing here: pip install {package}"
            ) from None


def t_quantile(df: int, level: float = LEVEL) -> float:
    """t such that P(|T| ≤ t) = level for Student's T with `df` degrees of freedom (t_{0.975, df} for 0.95)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    from scipy.stats import t  # imported here: the report's import stays light

    return float(t.ppf((1 + level) / 2, df))


def ci_half_width(values: Sequence[float], level: float = LEVEL) -> float:
    """t_{(1+level)/2, n−1} · s / √n over one value per seed; nan with fewer than two values. The one t interval."""
    n = len(values)
    if n < 2:
        return math.nan
    return t_quantile(n - 1, level) * statistics.stdev(values) / math.sqrt(n)


def mean_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """(mean, half-width of its `level` t interval); the half-width is nan with fewer than two values."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    return float(sum(values) / n), ci_half_width(values, level)


@dataclass
class Paired:
    mean: float  # mean of the per-seed differences a − b
    ci: float  # half-width of its 95% t interval
    p: float  # two-sided paired t test
    n: int
    sd: float  # sample standard deviation of the differences (nan below two)


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Paired:
    """a and b are per-seed values in the same seed order."""
    from scipy import stats

    if len(a) != len(b):
        raise ValueError(f"paired values need the same seeds: {len(a)} vs {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    mean, ci = mean_ci(diffs)
    p = math.nan
    if len(diffs) >= 2 and any(d != diffs[0] for d in diffs):
        p = float(stats.ttest_rel(a, b).pvalue)
    sd = statistics.stdev(diffs) if len(diffs) >= 2 else math.nan
    return Paired(mean, ci, p, len(diffs), sd)


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """Holm-adjusted p-values (nan stays nan and is left out of the family)."""
    from statsmodels.stats.multitest import multipletests

    known = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    adjusted = [math.nan] * len(pvalues)
    if known:
        _, corrected, _, _ = multipletests([pvalues[i] for i in known], alpha=alpha, method="holm")
        for i, p in zip(known, corrected):
            adjusted[i] = float(p)
    return adjusted


def separated(diff: Paired, p_holm: float, alpha: float = ALPHA) -> int:
    """-1 when the method is better than the baseline with separation (lower Δm: the CI of the difference is
    below 0 and Holm's p < alpha), +1 when worse with separation, 0 otherwise."""
    if math.isnan(p_holm) or math.isnan(diff.ci) or p_holm >= alpha:
        return 0
    if diff.mean + diff.ci < 0:
        return -1
    if diff.mean - diff.ci > 0:
        return 1
    return 0


def paired_power(effect: float, n: float, alpha: float) -> float:
    """Power of the two-sided paired t test on n pairs for a standardised effect (statsmodels TTestPower). Where
    statsmodels returns nan (its noncentral t fails for some large effects at n = 2-3), the same quantity from
    scipy's noncentral t: P(|T| > t_crit), T ~ nct(n - 1, effect √n)."""
    from scipy import stats
    from statsmodels.stats.power import TTestPower

    power = float(TTestPower().power(effect_size=effect, nobs=n, alpha=alpha, alternative="two-sided"))
    if math.isnan(power):
        df, crit, shift = n - 1, float(stats.t.ppf(1 - alpha / 2, n - 1)), effect * math.sqrt(n)
        lower = float(stats.nct.cdf(-crit, df, shift))  # nan far out in the tail, where it is ~0
        power = float(stats.nct.sf(crit, df, shift)) + (0.0 if math.isnan(lower) else lower)
    return power


def detectable_difference(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """The smallest paired mean difference a two-sided paired t test on n pairs with standard deviation `sd` of the
    differences detects with probability `power` at level `alpha`; nan with fewer than two pairs or sd 0.
    Bisection on TTestPower's power (its solve_power gives up beyond a standardised effect of 10, which two or
    three seeds at a Holm level need)."""
    if n < 2 or not sd > 0:
        return math.nan
    lo, hi = 0.0, 1.0
    while paired_power(hi, n, alpha) < power:
        lo, hi = hi, 2 * hi
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if paired_power(mid, n, alpha) < power else (lo, mid)
    return hi * sd


def seeds_needed(difference: float, sd: float, alpha: float, power: float = POWER) -> float:
    """The fewest pairs (seeds) with which a two-sided paired t test detects `difference` with probability `power`
    at level `alpha`; nan without a positive sd or difference."""
    if not sd > 0 or not difference > 0:
        return math.nan
    effect, n = difference / sd, 2
    while paired_power(effect, n, alpha) < power:
        n *= 2
    lo, hi = n // 2, n  # power(lo) < power <= power(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if paired_power(effect, mid, alpha) < power else (lo, mid)
    return float(hi)


def merge_directions(directions: Iterable[Optional[Mapping[str, Mapping[str, bool]]]]) -> dict[str, dict[str, bool]]:
    """Every task's metric directions (`higher_is_better`), merged over runs or groups: a single-task run knows its
    own task only. A metric's first direction stands (runs of one task set agree)."""
    merged: dict[str, dict[str, bool]] = {}
    for each in directions:
        for task, metrics in (each or {}).items():
            for name, higher in metrics.items():
                merged.setdefault(task, {}).setdefault(name, higher)
    return merged


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
