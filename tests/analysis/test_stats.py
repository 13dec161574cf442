"""analysis/stats.py against scipy and statsmodels on fixed numbers, and against the formulas by hand."""

from __future__ import annotations

import math

import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from mtl_bench.analysis.stats import (
    ci_half_width,
    detectable_difference,
    holm,
    mean_ci,
    mean_ranks,
    merge_directions,
    paired_difference,
    paired_power,
    seeds_needed,
    separated,
    t_quantile,
    tied_ranks,
)

A = [1.20, 0.85, 1.43, 0.97, 1.10]
B = [1.50, 1.05, 1.61, 1.40, 1.22]


def test_mean_ci_is_the_student_t_interval():
    mean, half = mean_ci(A)
    low, high = stats.t.interval(0.95, len(A) - 1, loc=sum(A) / len(A), scale=stats.sem(A))
    assert mean == pytest.approx((low + high) / 2)
    assert half == pytest.approx((high - low) / 2)
    # by hand: t_{0.975,4} = 2.7764451 (tables), s/sqrt(n)
    s = math.sqrt(sum((x - mean) ** 2 for x in A) / (len(A) - 1))
    assert half == pytest.approx(2.7764451 * s / math.sqrt(len(A)), rel=1e-6)
    assert math.isnan(mean_ci([1.0])[1])


def test_paired_difference_matches_ttest_rel():
    diff = paired_difference(A, B)
    d = [a - b for a, b in zip(A, B)]
    assert diff.mean == pytest.approx(sum(d) / len(d))
    low, high = stats.t.interval(0.95, len(d) - 1, loc=diff.mean, scale=stats.sem(d))
    assert diff.ci == pytest.approx((high - low) / 2)
    assert diff.p == pytest.approx(stats.ttest_rel(A, B).pvalue)
    # by hand: t = mean(d) / (sd(d)/sqrt(n)), p = 2 * P(T_{n-1} > |t|)
    t = diff.mean / stats.sem(d)
    assert diff.p == pytest.approx(2 * stats.t.sf(abs(t), len(d) - 1))
    assert diff.p < 0.05 and separated(diff, diff.p) == -1  # A is lower (better) on every seed


def test_paired_difference_of_identical_rows_has_no_p_value():
    assert math.isnan(paired_difference(A, A).p)
    with pytest.raises(ValueError):
        paired_difference(A, B[:3])


def test_holm_matches_statsmodels_and_the_step_down_rule():
    p = [0.01, 0.04, 0.03, 0.20]
    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))
    # by hand: sorted p_(i) * (m - i + 1), running maximum, capped at 1
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.20])
    assert holm([0.02, math.nan, 0.04])[1] != holm([0.02, math.nan, 0.04])[1]  # nan stays nan
    assert holm([0.02, math.nan, 0.04])[::2] == pytest.approx([0.04, 0.04])


def test_separation_needs_the_corrected_p_and_the_interval():
    diff = paired_difference(A, B)
    assert separated(diff, 0.2) == 0  # Holm's p too large
    assert separated(paired_difference(B, A), 0.01) == 1  # worse


def test_detectable_difference_and_seeds_needed_match_statsmodels():
    from statsmodels.stats.power import TTestPower

    solver = TTestPower()
    for sd, n, alpha in [(5.0, 5, 0.05 / 9), (1.3, 8, 0.05)]:
        effect = solver.solve_power(effect_size=None, nobs=n, alpha=alpha, power=0.8, alternative="two-sided")
        assert detectable_difference(sd, n, alpha) == pytest.approx(effect * sd, rel=1e-6)
    # Three seeds at a Holm level: solve_power stops at a wrong root (power 0.61 there); ours has power 0.8.
    three = detectable_difference(12.0, 3, 0.05 / 4)
    assert paired_power(three / 12.0, 3, 0.05 / 4) == pytest.approx(0.8, abs=1e-9)
    for effect, n, alpha in [(1.0, 5, 0.05), (3.0, 3, 0.0125), (16.0, 2, 0.025)]:  # the power itself: statsmodels'
        assert paired_power(effect, n, alpha) == pytest.approx(solver.power(effect_size=effect, nobs=n, alpha=alpha))
    needed = solver.solve_power(effect_size=2.0 / 5.0, nobs=None, alpha=0.05 / 9, power=0.8, alternative="two-sided")
    assert seeds_needed(2.0, 5.0, 0.05 / 9) == math.ceil(needed) == 86
    # Two seeds at Holm's level: beyond solve_power's bracket, still the difference with 80% power.
    two = detectable_difference(5.0, 2, 0.05 / 2)
    assert paired_power(two / 5.0, 2, 0.05 / 2) == pytest.approx(0.8, abs=1e-9)
    assert math.isnan(detectable_difference(5.0, 1, 0.05)) and math.isnan(detectable_difference(0.0, 5, 0.05))


def test_t_quantile_and_interval_formula():
    assert t_quantile(1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-12)  # Cauchy
    assert t_quantile(2) == pytest.approx(0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)), rel=1e-12)  # closed form, df 2
    assert t_quantile(10) == pytest.approx(2.228138852, rel=1e-9) and t_quantile(1000) == pytest.approx(1.962339081)
    assert ci_half_width([1.0, 2.0, 3.0]) == pytest.approx(t_quantile(2) * 1.0 / math.sqrt(3))
    assert math.isnan(ci_half_width([4.0]))  # one seed: no interval
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 5, 7, 30, 31, 120):
        assert t_quantile(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=1e-10)


def test_mean_rank_on_a_hand_made_case():
    assert tied_ranks([0.3, 0.1, 0.3, 0.2], higher_is_better=False) == [3.5, 1.0, 3.5, 2.0]
    assert tied_ranks([0.3, 0.1, 0.3, 0.2], higher_is_better=True) == [1.5, 4.0, 1.5, 3.0]
    hib = {"a": {"acc": True, "err": False}, "b": {"mse": False, "odd": None}}
    del hib["b"]["odd"]  # a metric without a direction is not ranked
    means = [
        {"a": {"acc": 0.9, "err": 0.2}, "b": {"mse": 5.0, "odd": 1.0}},
        {"a": {"acc": 0.8, "err": 0.2}, "b": {"mse": 1.0, "odd": 2.0}},
        {"a": {"acc": 0.9, "err": 0.1}},  # has no b/mse: ranked on what it has
        {"a": {"acc": math.nan}},
    ]  # nothing rankable
    # acc: 0.9, 0.8, 0.9 -> 1.5, 3, 1.5; err: 0.2, 0.2, 0.1 -> 2.5, 2.5, 1; mse: 5, 1 -> 2, 1
    assert mean_ranks(means, hib) == [
        pytest.approx((1.5 + 2.5 + 2) / 3),
        pytest.approx((3 + 2.5 + 1) / 3),
        pytest.approx((1.5 + 1) / 2),
        None,
    ]


def test_one_t_interval_and_one_merge_of_directions():
    values = [1.0, 2.5, 4.0, 3.0]
    assert mean_ci(values) == (2.625, ci_half_width(values))  # the study's interval is the report's
    merged = merge_directions([{"a": {"acc": True}}, None, {"b": {"mse": False}, "a": {"acc": False, "loss": False}}])
    assert merged == {"a": {"acc": True, "loss": False}, "b": {"mse": False}}  # a single-task run adds its task
