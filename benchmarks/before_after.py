"""Two trees' `scripts/bench_balancers.py --peers` tables side by side: each of our rows' ratio to the floor
before and after, and the pooled after/before ratio with its 95% t interval (scipy) over the rows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy import stats

Row = tuple[str, str, str]  # (T, method, variant)


def floor_ratios(table: str) -> dict[Row, float]:
    """Our variants' "x floor" column of one printed table (rows whose variant starts with "ours")."""
    found = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[0].isdigit() and cells[2].startswith("ours"):
            found[(cells[0], cells[1], cells[2])] = float(cells[5])
    return found


def pooled(before: Sequence[dict[Row, float]], after: Sequence[dict[Row, float]]) -> tuple[list[Row], dict]:
    """The rows every run has; per row the mean ratio of each side's runs; over the rows, the geometric mean of
    after/before with the 95% t interval and p value of the mean log ratio (scipy.stats.ttest_1samp)."""
    rows = [row for row in before[0] if all(row in run for run in [*before, *after])]
    logs = np.array([math.log(np.mean([run[r] for run in after]) / np.mean([run[r] for run in before])) for r in rows])
    test = stats.ttest_1samp(logs, 0.0)
    interval = test.confidence_interval(0.95)
    summary = {
        "rows": len(rows),
        "ratio": float(np.exp(logs.mean())),
        "low": float(np.exp(interval.low)),
        "high": float(np.exp(interval.high)),
        "p": float(test.pvalue),
    }
    return rows, summary


def report(before_paths: Sequence[Path], after_paths: Sequence[Path]) -> str:
    before = [floor_ratios(Path(p).read_text()) for p in before_paths]
    after = [floor_ratios(Path(p).read_text()) for p in after_paths]
    rows, summary = pooled(before, after)
    lines = [
        "| T | method | variant | x floor before | x floor after | after / before |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for row in rows:
        b, a = [run[row] for run in before], [run[row] for run in after]
        shown = ", ".join(f"{x:.2f}" for x in b), ", ".join(f"{x:.2f}" for x in a)
        lines.append(f"| {' | '.join(row)} | {shown[0]} | {shown[1]} | {np.mean(a) / np.mean(b):.3f} |")
    lines.append("")
    lines.append(
        f"pooled over {summary['rows']} rows: after / before {summary['ratio']:.3f} (95% t interval "
        f"{summary['low']:.3f} to {summary['high']:.3f}; p = {summary['p']:.2f})"
    )
    return "\n".join(lines)
