"""The default report: one short row per group (fits 100 columns) and a line naming the best group.

Columns: the group (the keys that differ between groups), seeds, Δm % (flat convention, ± 95% CI over seeds),
mean rank, time per step. Rows are sorted best first: by Δm when a baseline was given, else by mean rank. The
baseline group is shown and marked; `-b reference` adds the task set's reference row; `--published NAME` adds the
paper's rows, marked as published (their Δm as printed). Where the paper's per-metric values are transcribed, the
mean rank is recomputed over the paper's metrics with the user's groups and the paper's rows ranked together
("MR ↓ recomputed", as FAMO recomputed the baselines' MRs with its own row added) and the printed MR has a column
of its own; otherwise the published rows show their MR as printed and the groups' rank is among the groups only.

The winner line: the best group is "separated from the runner-up" when their 95% intervals of Δm do not overlap
(best Δm + its CI < runner-up Δm − its CI). Mean rank has no interval: without a baseline the line says so.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from mtl_bench.report.numbers import significant
from mtl_bench.report.published import Metrics, PublishedTable, joint_ranks, protocol_gaps
from mtl_bench.report.summary import Group, by_task_set
from mtl_bench.report.tables import markdown_table, rich_table

WIDTH = 100
NA = "n/a"
# why a quantity that is never negative may show no interval (summary.Stat.of)
TIME_NA = (
    "Student t's interval would reach below zero for a quantity that is never negative: too few seeds for that "
    "spread (run more seeds)"
)


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
    printed_mr: Optional[float] = None  # a published row's MR as printed, when the ranks were recomputed
    metrics: Optional[Metrics] = None  # a published row's per-metric values (our names and units), when printed
    printed: Optional[dict[str, dict[str, str]]] = None  # the same as printed (its digits, in our units)
    tag: str = ""  # the group's runs' tags (shown in a column when they differ between groups)
    mib: Optional[float] = None  # peak memory of the group's largest run (metrics.json), MiB


def shared_terms(part: list[Group]) -> list[str]:
    """The label terms every group of a table has: stated once above it instead of in every row (none for one
    group, whose label is all it has)."""
    if len(part) < 2:
        return []
    return [term for term in part[0].terms if all(term in g.terms for g in part[1:])]


def display_label(group: Group, shared: list[str]) -> str:
    """The group's label without the terms every row of its table has."""
    kept = [term for term in group.terms if term not in shared]
    if not group.terms or not kept:
        return group.label
    return " ".join(kept) + group.label[len(" ".join(group.terms)) :]  # a disambiguating " [dir]" stays


def tag_text(group: Group) -> str:
    return ", ".join(group.tags)


def tags_vary(part: list[Group]) -> bool:
    """Whether the groups' tags differ (then a tag column), or every run has the same one (stated above)."""
    return len({tuple(g.tags) for g in part}) > 1


def above_line(part: list[Group], common: Sequence[str]) -> Optional[str]:
    """What every run of a table has, stated once above it: the overrides every run typed, the label terms every
    row shares, and the tag when every group has the same one."""
    items = [*common, *shared_terms(part)]
    if not tags_vary(part) and len(part[0].tags) == 1:
        items += part[0].tags
    return f"every run has: {' '.join(items)}" if items else None


def _group_row(group: Group, rank: Optional[float], shared: Sequence[str] = ()) -> Row:
    dm = None if group.delta_m is None else group.delta_m["flat"]
    ci = (group.delta_m_ci or {}).get("flat", math.nan)
    t = group.time_per_step
    return Row(
        display_label(group, list(shared)),
        group.count,
        dm,
        ci,
        rank,
        None if t is None else 1000 * t.mean,
        math.nan if t is None else 1000 * t.ci,
        "baseline" if group.is_baseline else "",
        tag=tag_text(group),
        mib=None if group.peak_memory is None else group.peak_memory["bytes"] / 2**20,
    )


def _key(row: Row, by_dm: bool) -> float:
    value = row.dm if by_dm else row.rank
    return math.inf if value is None or math.isnan(value) else value


def ranked(groups: list[Group], by_dm: bool, ranks: Optional[list[Optional[float]]] = None) -> list[Row]:
    """The user's groups as rows, best first; `ranks` replaces their mean ranks among themselves."""
    ranks = [g.mean_rank for g in groups] if ranks is None else ranks
    shared = shared_terms(groups)
    return sorted((_group_row(g, r, shared) for g, r in zip(groups, ranks)), key=lambda r: _key(r, by_dm))


def _pm(value: Optional[float], ci: float, fmt: str) -> str:
    if value is None or math.isnan(value):
        return ""
    return f"{value:{fmt}} ± {NA if math.isnan(ci) else format(ci, fmt.lstrip('+'))}"


def cells(row: Row, with_dm: bool, printed_mr: bool = False, with_tag: bool = False, memory: bool = False) -> list[str]:
    label = row.label + (f" [{row.mark}]" if row.mark in ("baseline", "published") else "")
    out = [label, *([row.tag] if with_tag else []), row.seeds]
    if with_dm:
        if row.mark in ("baseline", "reference"):
            out.append("baseline")
        elif row.mark == "published":
            out.append("" if row.dm is None else f"{row.dm:+.2f}")
        else:
            out.append(_pm(row.dm, row.dm_ci, "+.2f"))
    out.append("" if row.rank is None else f"{row.rank:.2f}")
    if printed_mr:
        out.append("" if row.printed_mr is None else f"{row.printed_mr:.2f}")
    out.append(
        ""
        if row.ms is None
        else f"{significant(row.ms, 3)} ± {NA if math.isnan(row.ms_ci) else significant(row.ms_ci, 2)}"
    )
    if memory:
        out.append("" if row.mib is None else f"{row.mib:.0f}")
    return out


def headers(with_dm: bool, recomputed: bool = False, with_tag: bool = False, memory: bool = False) -> list[str]:
    rank = ["MR ↓ recomputed", "MR printed"] if recomputed else ["mean rank ↓"]
    tag = ["tag"] if with_tag else []
    return [
        "group",
        *tag,
        "seeds",
        *(["Δm % ↓ (± 95% CI)"] if with_dm else []),
        *rank,
        "ms/step",
        *(["peak MiB"] if memory else []),
    ]


def _names(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def winner_line(rows: list[Row], by_dm: bool) -> str:
    """Which group is best and whether it is separated from the runner-up by more than the 95% intervals."""
    rows = [r for r in rows if _key(r, by_dm) != math.inf]
    if len(rows) < 2:
        return "one group: nothing to compare" if rows else "no group to compare"
    best, runner = rows[0], rows[1]
    if not by_dm and best.rank == runner.rank:
        tied = [r.label for r in rows if r.rank == best.rank]
        every = " all" if len(tied) == len(rows) and len(tied) > 2 else ""
        return f"no single best group: {_names(tied)}{every} tie on mean rank ({best.rank:.2f})"
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


def published_rows(table: PublishedTable, ranks: Optional[list[float]] = None) -> list[Row]:
    """The paper's rows, best Δm first: with `ranks` (recomputed, in the table's order) the printed MR moves to
    its own column."""
    rows = [
        Row(
            r.method,
            "3",
            r.delta_m,
            math.nan,
            r.mr,
            mark="published",
            metrics=table.metrics(r) if r.printed else None,
            printed=table.printed_text(r) if r.printed else None,
        )
        for r in table.rows
    ]
    for row, rank in zip(rows, ranks or []):
        row.printed_mr, row.rank = row.rank, rank
    return sorted(rows, key=lambda r: math.inf if r.dm is None else r.dm)


def recomputed_ranks(
    part: list[Group], table: Optional[PublishedTable]
) -> Optional[tuple[list[Optional[float]], list[float]]]:
    """The groups' and the paper's rows' mean ranks among each other, when the paper's per-metric values exist."""
    if table is None or not table.has_metrics:
        return None
    return joint_ranks(table, [g.means for g in part])


def table_text(
    header: list[str], body: list[list[str]], title: str, markdown: bool, above: Optional[str] = None
) -> str:
    """The table under its title and `above` (what every row has)."""
    if markdown:
        lines = [f"### {title}", ""] if title else []
        lines += [above, ""] if above else []
        return "\n".join(lines + markdown_table(header, body)) + "\n"
    head = "".join(line + "\n" for line in (title, wrap(above or "")) if line)
    return head + rich_table(header, body, max_width=WIDTH, fold_first=True)


def wrap(line: str) -> str:
    return "\n".join(textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False))


def compact_report(
    parts: dict[str, list[Group]],
    baseline: Optional[str],
    published: Optional[dict[str, PublishedTable]],
    markdown: bool,
    common: Sequence[str] = (),
) -> tuple[str, list[str]]:
    """One short table per task set, each followed by its winner line; returns the text and the winner lines."""
    blocks: list[str] = []
    winners: list[str] = []
    if not parts:
        return "no group to rank: no completed run learned (each is listed below)\n", winners
    for tasks, part in parts.items():
        by_dm = any(g.delta_m is not None for g in part)
        table = (published or {}).get(tasks)
        joint = recomputed_ranks(part, table)
        verdict = winner_line(ranked(part, by_dm), by_dm)  # among the user's groups only
        rows = ranked(part, by_dm, None if joint is None else joint[0])
        extra: list[Row] = []
        if baseline == "reference" and by_dm:
            extra.append(Row("reference (tasks.reference, single-task)", "", mark="reference"))
        if table is not None:
            extra += published_rows(table, None if joint is None else joint[1])
        with_tag = tags_vary(part)
        memory = any(r.mib is not None for r in rows)  # runs from before metrics.json had peak_memory: no column
        body = [cells(r, by_dm, joint is not None, with_tag, memory) for r in rows + extra]
        title = f"tasks={tasks}" if len(parts) > 1 else ""
        header = headers(by_dm, joint is not None, with_tag, memory)
        text = table_text(header, body, title, markdown, above_line(part, common))
        blocks.append(text + wrap(verdict) + "\n")
        winners.append(f"{title + ': ' if title else ''}{verdict}")
    return "\n".join(blocks), winners


def protocol_settings(group: Group) -> Optional[dict[str, Any]]:
    """The group's config as it trained, for the protocol check; None without a saved config. A length typed on
    the command line replaced the preset's (engine/compose.py apply_length) after Hydra saved the config, which
    still holds both: the one not typed is dropped here."""
    if group.runs[0].config is None:
        return None
    settings = dict(group.settings)
    lengths = ("trainer.max_steps", "trainer.epochs")
    if all(settings.get(k) is not None for k in lengths):
        typed = [k for k in lengths if k in group.overridden]
        if len(typed) == 1:
            settings[lengths[1 - lengths.index(typed[0])]] = None
    return settings


def protocol_lines(parts: dict[str, list[Group]], published: Optional[dict[str, PublishedTable]]) -> list[str]:
    """Per published table: whether the user's groups ran the paper's protocol (length, split, model selection);
    a group that did not is not comparable with the paper's rows, whatever its numbers."""
    lines = []
    for tasks, part in parts.items():
        table = (published or {}).get(tasks)
        if table is None or not table.protocol:
            continue
        where = f"{table.source}'s {table.table.split(' (')[0]}" + (f" (tasks={tasks})" if len(parts) > 1 else "")
        preset = f"experiment={table.experiment}" if table.experiment else "the paper's settings"
        found: dict[Optional[tuple[str, ...]], list[str]] = {}
        for group in part:
            found_gaps = protocol_gaps(table, protocol_settings(group))
            found.setdefault(None if found_gaps is None else tuple(found_gaps), []).append(group.label)
        if list(found) == [()]:
            lines.append(f"protocol: every group ran the length, split and model selection of {where} ({preset})")
            continue
        parts_text = []
        for gaps, labels in found.items():
            what = (
                "on it" if gaps == () else "unknown (no .hydra/config.yaml saved)" if gaps is None else ", ".join(gaps)
            )
            parts_text.append(what if len(found) == 1 else f"{_names(labels)}: {what}")
        lines.append(
            f"NOT COMPARABLE with the [published] rows: your runs are not on the protocol of {where} (length, split, "
            f"model selection: {preset}): " + "; ".join(parts_text)
            if any(g for g in found if g)
            else f"cannot tell whether your runs follow the protocol of {where} ({preset}): " + "; ".join(parts_text)
        )
    return lines


def compact_notes(
    groups: list[Group], baseline: Optional[str], published: Optional[dict[str, PublishedTable]]
) -> list[str]:
    lines = protocol_lines(by_task_set(groups), published)
    if any(g.delta_m is not None for g in groups):
        against = "the paper's single-task row" if published else baseline
        lines.append(
            f"Δm %: flat (mean relative drop over every final test metric) against {against}; lower is better; "
            "± 95% CI of each seed's Δm (Student t; n/a with one seed)"
        )
    tables = list((published or {}).values())
    if not all(t.has_metrics for t in tables) or not tables:
        lines.append("mean rank: among your groups on every metric, 1 = best; ms/step: wall_time_s / step")
    for table in tables:
        if table.has_metrics:
            lines.append(
                f"[published]: {table.paper}, {table.table}: Δm as printed; MR ↓ recomputed: mean rank over the "
                f"paper's {len(table.columns)} metrics among your groups and its {len(table.rows)} rows together "
                "(from the values it prints; 1 = best, ties share the mean rank); MR printed: the paper's, among "
                f"its methods only{' (counted from 0)' if table.mr_base == 0 else ''}; ms/step: wall_time_s / step"
            )
        else:
            lines.append(
                f"[published]: {table.paper}, {table.table}: Δm and MR as printed (MR ranks the paper's methods "
                "only: not recomputed with yours, the per-metric values are not transcribed)"
            )
        lines += [f"  note: {note}" for note in table.notes]
        lines += [f"  note {r.method}: {r.note}" for r in table.rows if r.note]
    labels = sorted({str(g.peak_memory.get("label")) for g in groups if g.peak_memory})
    if labels:
        lines.append(f"peak MiB: the group's largest run's metrics.json peak_memory ({', '.join(labels)})")
    if any(g.time_per_step is not None and g.time_per_step.below_zero for g in groups):
        lines.append(f"ms/step ± {NA}: {TIME_NA}")
    lines.append("per-metric table: --wide, or --format markdown/csv/json")
    return [wrap(line) for line in lines]
