"""The study's statistics, from scipy and statsmodels (no torch).

Over the final seeds s = 1..n of a method:
  mean ± t_{0.975, n-1} · s/√n              (Student t interval of the mean; scipy.stats.t)
  d_s = Δm_method(s) − Δm_scalarization(s)    paired by seed (same seed: same initialisation and data order)
  mean(d) ± t_{0.975, n-1} · sd(d)/√n, p from the paired t test (scipy.stats.ttest_rel, two-sided)
  Holm's step-down correction of the p-values over the methods compared (Holm 1979;
  statsmodels.stats.multitest.multipletests(method="holm")).
Power of the paired t test (statsmodels.stats.power.TTestPower, the one-sample t test on the differences):
  the smallest mean difference detectable with probability POWER at level α is d* · sd(d), where d* is the
  standardised effect TTestPower solves for with n and α; the seeds that would detect a difference δ solve the same
  equation for n with effect δ / sd(d). α is Holm's strictest level, ALPHA / m over the m methods compared: the level
  a lone true difference faces (Holm tests the smallest p at ALPHA / m first).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

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


def mean_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """(mean, half-width of its `level` t interval); the half-width is nan with fewer than two values."""
    from scipy import stats

    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = float(sum(values) / n)
    if n < 2:
        return mean, math.nan
    return mean, float(stats.t.ppf((1 + level) / 2, n - 1) * stats.sem(values))


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
