"""The default report: one short row per group (fits 100 columns) and a line naming the best group.

Columns: the group (the keys that differ between groups), seeds, Δm % (flat convention, ± 95% CI over seeds),
mean rank, time per step. Rows are sorted best first: by Δm when a baseline was given, else by mean rank. The
baseline group is shown and marked; `-b reference` adds the task set's reference row; `--published NAME` adds the
paper's rows, marked as published (their Δm and MR as printed).

The winner line: the best group is "separated from the runner-up" when their 95% intervals of Δm do not overlap
(best Δm + its CI < runner-up Δm − its CI). Mean rank has no interval: without a baseline the line says so.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Optional

from mtl_bench.report.numbers import significant
from mtl_bench.report.published import PublishedTable
from mtl_bench.report.summary import Group

WIDTH = 100
NA = "n/a"


@dataclass
class Row:
    label: str
    seeds: str
    dm: Optional[float] = None
    dm_ci: float = math.nan
    rank: Optional[float] = None
    ms: Optional[float] = None
    ms_ci: float = math.nan
    mark: str = ""  # "baseline", "reference", "published"


def _group_row(group: Group) -> Row:
    dm = None if group.delta_m is None else group.delta_m["flat"]
    ci = (group.delta_m_ci or {}).get("flat", math.nan)
    t = group.time_per_step
    return Row(
        group.label,
        group.count,
        dm,
        ci,
        group.mean_rank,
        None if t is None else 1000 * t.mean,
        math.nan if t is None else 1000 * t.ci,
        "baseline" if group.is_baseline else "",
    )


def _key(row: Row, by_dm: bool) -> float:
    value = row.dm if by_dm else row.rank
    return math.inf if value is None or math.isnan(value) else value


def ranked(groups: list[Group], by_dm: bool) -> list[Row]:
    """The user's groups as rows, best first."""
    return sorted((_group_row(g) for g in groups), key=lambda r: _key(r, by_dm))


def _pm(value: Optional[float], ci: float, fmt: str) -> str:
    if value is None or math.isnan(value):
        return ""
    return f"{value:{fmt}} ± {NA if math.isnan(ci) else format(ci, fmt.lstrip('+'))}"


def cells(row: Row, with_dm: bool) -> list[str]:
    label = row.label + (f" [{row.mark}]" if row.mark in ("baseline", "published") else "")
    out = [label, row.seeds]
    if with_dm:
        if row.mark in ("baseline", "reference"):
            out.append("baseline")
        elif row.mark == "published":
            out.append("" if row.dm is None else f"{row.dm:+.2f}")
        else:
            out.append(_pm(row.dm, row.dm_ci, "+.2f"))
    out.append("" if row.rank is None else f"{row.rank:.2f}")
    out.append(
        ""
        if row.ms is None
        else f"{significant(row.ms, 3)} ± {NA if math.isnan(row.ms_ci) else significant(row.ms_ci, 2)}"
    )
    return out


def headers(with_dm: bool) -> list[str]:
    return ["group", "seeds", *(["Δm % ↓ (± 95% CI)"] if with_dm else []), "mean rank ↓", "ms/step"]


def winner_line(rows: list[Row], by_dm: bool) -> str:
    """Which group is best and whether it is separated from the runner-up by more than the 95% intervals."""
    rows = [r for r in rows if _key(r, by_dm) != math.inf]
    if len(rows) < 2:
        return "one group: nothing to compare" if rows else "no group to compare"
    best, runner = rows[0], rows[1]
    if not by_dm and best.rank == runner.rank:
        return f"no single best group: {best.label} and {runner.label} tie on mean rank ({best.rank:.2f})"
    if not by_dm:
        return (
            f"best by mean rank: {best.label} ({best.rank:.2f}; runner-up {runner.label}: {runner.rank:.2f}); "
            "mean rank has no interval: give --baseline for Δm with its 95% CI"
        )
    assert best.dm is not None and runner.dm is not None

    def dm(row: Row) -> str:
        return "the baseline" if row.mark == "baseline" else f"Δm {row.dm:+.2f}"

    head = f"best: {best.label} ({dm(best)}); runner-up: {runner.label} ({dm(runner)}): "
    if math.isnan(best.dm_ci) or math.isnan(runner.dm_ci):
        return head + "cannot tell whether they differ (one seed gives no interval: run more seeds)"
    if best.dm + best.dm_ci < runner.dm - runner.dm_ci:
        return head + "separated by more than their 95% CIs"
    return head + "NOT separated: their 95% CIs overlap (more seeds, or call it a tie)"


def published_rows(table: PublishedTable) -> list[Row]:
    return [
        Row(f"{r.method} ({table.source})", "3", r.delta_m, math.nan, r.mr, mark="published")
        for r in sorted(table.rows, key=lambda r: math.inf if r.delta_m is None else r.delta_m)
    ]


def table_text(header: list[str], body: list[list[str]], title: str, markdown: bool) -> str:
    if markdown:
        lines = [f"### {title}", ""] if title else []
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body]) + "\n"
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(title=title or None, title_justify="left")
    for i, name in enumerate(header):  # only the group column wraps; the numbers stay on one line
        table.add_column(name, overflow="fold", no_wrap=i > 0, ratio=1 if i == 0 else None)
    from rich.markup import escape

    for row in body:
        table.add_row(*(escape(cell) for cell in row))  # "[baseline]" is text, not rich markup
    widths = [max(len(cell) for cell in column) for column in zip(header, *body)]
    width = min(WIDTH, sum(w + 3 for w in widths) + 1)
    console = Console(file=io.StringIO(), width=width, force_terminal=False)
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]


def wrap(line: str) -> str:
    return "\n".join(textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False))


def compact_report(
    parts: dict[str, list[Group]],
    baseline: Optional[str],
    published: Optional[dict[str, PublishedTable]],
    markdown: bool,
) -> tuple[str, list[str]]:
    """One short table per task set, each followed by its winner line; returns the text and the winner lines."""
    blocks: list[str] = []
    winners: list[str] = []
    if not parts:
        return "no group to rank: no completed run learned (each is listed below)\n", winners
    for tasks, part in parts.items():
        by_dm = any(g.delta_m is not None for g in part)
        rows = ranked(part, by_dm)
        verdict = winner_line(rows, by_dm)
        extra: list[Row] = []
        if baseline == "reference" and by_dm:
            extra.append(Row("reference (tasks.reference, single-task)", "", mark="reference"))
        table = (published or {}).get(tasks)
        if table is not None:
            extra += published_rows(table)
        body = [cells(r, by_dm) for r in rows + extra]
        title = f"tasks={tasks}" if len(parts) > 1 else ""
        blocks.append(table_text(headers(by_dm), body, title, markdown) + wrap(verdict) + "\n")
        winners.append(f"{title + ': ' if title else ''}{verdict}")
    return "\n".join(blocks), winners


def compact_notes(
    groups: list[Group], baseline: Optional[str], published: Optional[dict[str, PublishedTable]]
) -> list[str]:
    lines = []
    if any(g.delta_m is not None for g in groups):
        against = "the paper's single-task row" if published else baseline
        lines.append(
            f"Δm %: flat (mean relative drop over every final test metric) against {against}; lower is better; "
            "± 95% CI of each seed's Δm (Student t; n/a with one seed)"
        )
    lines.append("mean rank: among the groups above on every metric, 1 = best; ms/step: wall_time_s / step")
    for table in (published or {}).values():
        lines.append(
            f"[published]: {table.paper}, {table.table}: Δm and MR as printed (MR ranks the paper's methods only: "
            "not recomputed with yours, the per-metric values are not transcribed)"
        )
        lines += [f"  note: {note}" for note in table.notes]
        lines += [f"  note {r.method}: {r.note}" for r in table.rows if r.note]
    lines.append("per-metric table: --wide, or --format markdown/csv/json")
    return [wrap(line) for line in lines]
