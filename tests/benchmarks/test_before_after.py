"""benchmarks/before_after.py: the rows read from bench_balancers tables, and the pooled ratio's t interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from benchmarks.before_after import floor_ratios, pooled, report

HEADER = "| T | method | variant | ms/step | x fixed | x floor | x torchjd | x LibMTL | peak MB/step |\n|---:|---|---|"


def table(rows: dict[tuple[str, str], float]) -> str:
    lines = [HEADER, "| 10 | mgda | floor | 200.0 | 5.00 | 1.00 |  |  | nan |"]
    lines += [f"| 10 | {m} | {v} | 1.0 | 1.00 | {x:.2f} |  |  | nan |" for (m, v), x in rows.items()]
    lines.append("| 10 | mgda | torchjd | 400.0 | 10.00 | 2.00 | 1.00 |  | nan |")
    return "\n".join(lines)


BEFORE = {("mgda", "ours"): 1.10, ("mgda", "ours rep"): 0.20, ("upgrad", "ours"): 1.20}
AFTER = {("mgda", "ours"): 1.21, ("mgda", "ours rep"): 0.20, ("upgrad", "ours"): 1.08}


def test_only_our_rows_are_read_with_their_floor_ratio():
    assert floor_ratios(table(BEFORE)) == {("10", m, v): x for (m, v), x in BEFORE.items()}


def test_the_pooled_ratio_and_interval_are_the_t_interval_of_the_mean_log_ratio():
    rows, summary = pooled([floor_ratios(table(BEFORE))], [floor_ratios(table(AFTER))])
    logs = np.log([AFTER[k] / BEFORE[k] for k in BEFORE])
    half = stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    assert len(rows) == summary["rows"] == 3
    assert summary["ratio"] == pytest.approx(math.exp(logs.mean()))
    assert summary["low"] == pytest.approx(math.exp(logs.mean() - half))
    assert summary["high"] == pytest.approx(math.exp(logs.mean() + half))
    assert summary["p"] == pytest.approx(stats.ttest_1samp(logs, 0.0).pvalue)


def test_runs_of_one_side_are_averaged_per_row_and_a_row_missing_from_a_run_is_left_out(tmp_path):
    second = {**BEFORE, ("mgda", "ours"): 1.30}
    del second[("upgrad", "ours")]
    paths = []
    for name, rows in (("b1", BEFORE), ("b2", second), ("a1", AFTER)):
        paths.append(tmp_path / f"{name}.md")
        paths[-1].write_text(table(rows))
    text = report(paths[:2], paths[2:])
    assert "| 10 | mgda | ours | 1.10, 1.30 | 1.21 | 1.008 |" in text and "upgrad" not in text
    assert text.splitlines()[-1].startswith("pooled over 2 rows: after / before ")


def test_any_column_of_any_table_is_compared_by_its_rows_labels(tmp_path):
    head = "| experiment | balancer | ms/step | x fixed |\n|---|---|---:|---:|\n"
    before = head + "| toy | fixed | 4.00 | 1.00x |\n| toy | forum | 20.00 | 5.00x |\n"
    after = head + "| toy | fixed | 5.00 | 1.00x |\n| toy | forum | 20.00 | 4.00x |\n"
    (tmp_path / "b.md").write_text(before)
    (tmp_path / "a.md").write_text(after)
    text = report([tmp_path / "b.md"], [tmp_path / "a.md"], column="ms/step")
    assert "| experiment | balancer | ms/step before | ms/step after | after / before |" in text
    assert "| toy | fixed | 4.00 | 5.00 | 1.250 |" in text and "| toy | forum | 20.00 | 20.00 | 1.000 |" in text
    assert text.splitlines()[-1].startswith(f"pooled over 2 rows: after / before {math.sqrt(1.25):.3f} ")
