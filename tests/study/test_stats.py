"""The study's statistics against scipy and statsmodels on fixed numbers, and against the formulas by hand."""

from __future__ import annotations

import math

import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from mtl_bench.study.stats import holm, mean_ci, paired_difference, separated

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
