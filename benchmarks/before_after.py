"""Two trees' benchmark tables side by side: by default each of our rows' ratio to the floor in
`scripts/bench_balancers.py --peers` tables, or any one column of any of the scripts' tables (`column`, e.g.
ms/step of `scripts/bench_bilevel.py`); before and after, and the pooled after/before ratio with its 95% t interval
(scipy) over the rows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy import stats

Row = tuple[str, ...]  # the row's labels: (T, method, variant) of a peers table


def floor_ratios(table: str) -> dict[Row, float]:
    """Our variants' "x floor" column of one printed table (rows whose variant starts with "ours")."""
    found = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[0].isdigit() and cells[2].startswith("ours"):
            found[(cells[0], cells[1], cells[2])] = float(cells[5])
    return found


def column_values(table: str, column: str) -> tuple[list[str], dict[Row, float]]:
    """The labels of the table's rows (the text columns before `column`) and each row's value in `column`."""
    header: list[str] = []
    found: dict[Row, float] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column in cells and not header:
            header = cells
        elif header and len(cells) == len(header) and not set(cells[0]) <= set("-: "):
            at = header.index(column)
            labels = [i for i in range(at) if not header[i].startswith(("x ", "ms/", "peak"))]
            found[tuple(cells[i] for i in labels)] = float(cells[at].rstrip("x"))
    if not header:
        raise ValueError(f"no table with a column {column!r}")
    at = header.index(column)
    return [h for h in header[:at] if not h.startswith(("x ", "ms/", "peak"))], found


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


def report(before_paths: Sequence[Path], after_paths: Sequence[Path], column: str | None = None) -> str:
    """`column` None: our rows' "x floor" of peers tables; else that column of each table's rows."""
    labels, name = ["T", "method", "variant"], "x floor"
    if column is None:
        before = [floor_ratios(Path(p).read_text()) for p in before_paths]
        after = [floor_ratios(Path(p).read_text()) for p in after_paths]
    else:
        read = [column_values(Path(p).read_text(), column) for p in [*before_paths, *after_paths]]
        labels, name = read[0][0], column
        before, after = (
            [values for _, values in read[: len(before_paths)]],
            [values for _, values in read[len(before_paths) :]],
        )
    rows, summary = pooled(before, after)
    lines = [
        f"| {' | '.join(labels)} | {name} before | {name} after | after / before |",
        "|" + "---|" * len(labels) + "---:|---:|---:|",
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
