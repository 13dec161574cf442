"""The report as a rich table (terminal), markdown, csv or json."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Sequence

from mtl_bench.report.numbers import selection_text, significant
from mtl_bench.report.published import PublishedTable
from mtl_bench.report.summary import Group, Stat, by_task_set
from mtl_bench.report.tables import markdown_table, rich_table

FORMATS = ("table", "markdown", "csv", "json")


def _columns(groups: list[Group]) -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], None] = {}
    for group in groups:
        for task, metrics in group.stats.items():
            for name in metrics:
                seen[(task, name)] = None
    return list(seen)


NA = "n/a"  # an interval over one seed


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


def _pm(mean: float, ci: float, digits: int) -> str:
    """`mean ± CI half-width`, `mean ± n/a` with one seed."""
    return f"{significant(mean, digits)} ± {NA if math.isnan(ci) else significant(ci, 2)}"


def _cell(group: Group, task: str, name: str) -> str:
    stat = group.stats.get(task, {}).get(name)
    return "" if stat is None else _pm(stat.mean, stat.ci, 4)


def _arrow(groups: list[Group], task: str, name: str) -> str:
    for group in groups:
        if name in group.higher_is_better.get(task, {}):
            return "↑" if group.higher_is_better[task][name] else "↓"
    return ""


def _dm(group: Group, key: str) -> str:
    if group.delta_m is None:
        return ""
    if group.is_baseline:  # compared with itself: 0 by definition
        return "baseline"
    ci = group.delta_m_ci[key] if group.delta_m_ci else math.nan
    return f"{group.delta_m[key]:+.2f} ± {NA}" if math.isnan(ci) else f"{group.delta_m[key]:+.2f} ± {ci:.2f}"


def _rank(group: Group) -> str:
    return "" if group.mean_rank is None else f"{group.mean_rank:.2f}"


def _time(group: Group) -> str:
    t = group.time_per_step
    return "" if t is None else _pm(1000 * t.mean, 1000 * t.ci, 3)


DM_HEADER = {"flat": "Δm flat % ↓", "task_averaged": "Δm task-avg % ↓"}
RANK_HEADER, TIME_HEADER = "mean rank ↓", "time/step ms"


def rows(
    groups: list[Group], table: PublishedTable | None = None, common: Sequence[str] = ()
) -> tuple[list[str], list[list[str]], str | None]:
    """The table: group, seeds, each metric (mean ± 95% CI), Δm (± CI), mean rank, time per step (± CI); with a
    paper's `table`, its rows below the groups (their printed values in the metric columns, Δm as printed; the mean
    rank recomputed with the groups where the values are printed, as in the default table). Also the line of what
    every row has (compact.above_line), stated once above the table."""
    from mtl_bench.report.compact import (
        above_line,
        display_label,
        published_rows,
        recomputed_ranks,
        shared_terms,
        tag_text,
        tags_vary,
    )

    columns = _columns(groups)
    joint = recomputed_ranks(groups, table)
    with_tag = tags_vary(groups)
    header = ["group", *(["tag"] if with_tag else []), "seeds"]
    header += [f"{t}/{m} {_arrow(groups, t, m)}".strip() for t, m in columns]
    with_dm = any(g.delta_m is not None for g in groups)
    if with_dm:
        header += list(DM_HEADER.values())
    header += ["MR ↓ recomputed", "MR printed"] if joint is not None else [RANK_HEADER]
    header.append(TIME_HEADER)
    shared = shared_terms(groups)
    body = []
    for i, group in enumerate(groups):
        row = [display_label(group, shared), *([tag_text(group)] if with_tag else []), group.count]
        row += [_cell(group, t, m) for t, m in columns]
        if with_dm:
            row += [_dm(group, key) for key in DM_HEADER]
        if joint is None:
            row.append(_rank(group))
        else:
            row += ["" if joint[0][i] is None else f"{joint[0][i]:.2f}", ""]
        body.append(row + [_time(group)])
    if table is not None:
        for published in published_rows(table, None if joint is None else joint[1]):
            row = [f"{published.label} [published]", *([""] if with_tag else []), published.seeds]
            row += [(published.printed or {}).get(t, {}).get(m, "") for t, m in columns]
            if with_dm:
                row += ["" if published.dm is None else f"{published.dm:+.2f}", ""]
            row.append("" if published.rank is None else f"{published.rank:.2f}")
            if joint is not None:
                row.append("" if published.printed_mr is None else f"{published.printed_mr:.2f}")
            body.append(row + [""])
    return header, body, above_line(groups, common)


def _number(x: float | None) -> str:
    return "" if x is None else NA if math.isnan(x) else repr(float(x))


def csv_rows(
    groups: list[Group], published: dict[str, PublishedTable] | None = None
) -> tuple[list[str], list[list[str]]]:
    """The table as numbers, one column each: mean, std and 95% CI half-width ("n/a" with one seed), and the runs'
    tags; with `published`, the paper's rows after the groups (its printed values as means, Δm as printed, the
    recomputed and the printed MR) and, per group, whether it ran the paper's protocol."""
    from mtl_bench.report.compact import published_rows, recomputed_ranks

    columns = _columns(groups)
    header = ["group", "seeds"]
    for t, m in columns:
        name = f"{t}/{m}"
        header += [f"{name} {_arrow(groups, t, m)}".strip(), f"{name} std", f"{name} ci95"]
    with_dm = any(g.delta_m is not None for g in groups)
    if with_dm:
        for key, title in DM_HEADER.items():
            header += [title, title.split(" %")[0] + " ci95"]
    header += [RANK_HEADER, TIME_HEADER, f"{TIME_HEADER} ci95", "tag"]
    if published:
        header += ["MR printed", "published protocol"]
    body = []
    parts = by_task_set(groups)
    joint = {tasks: recomputed_ranks(parts.get(tasks, []), table) for tasks, table in (published or {}).items()}
    for group in groups:
        row = [group.label, group.count]
        for t, m in columns:
            stat = group.stats.get(t, {}).get(m)
            row += ["", "", ""] if stat is None else [_number(stat.mean), _number(stat.std), _number(stat.ci)]
        if with_dm:
            for key in DM_HEADER:
                row += (
                    ["", ""]
                    if group.delta_m is None
                    else [_number(group.delta_m[key]), _number((group.delta_m_ci or {}).get(key, math.nan))]
                )
        time = group.time_per_step
        tasks = next(t for t, part in parts.items() if group in part)
        ranks = joint.get(tasks)
        rank = group.mean_rank if ranks is None else ranks[0][parts[tasks].index(group)]
        row += [
            _number(rank),
            *(["", ""] if time is None else [_number(1000 * time.mean), _number(1000 * time.ci)]),
            ", ".join(group.tags),
        ]
        if published:
            row += ["", _protocol_cell((published or {}).get(tasks), group)]
        body.append(row)
    for tasks, table in (published or {}).items():
        ranks = joint.get(tasks)
        for pub in published_rows(table, None if ranks is None else ranks[1]):
            row = [f"{pub.label} [published]", pub.seeds]
            for t, m in columns:
                value = (pub.metrics or {}).get(t, {}).get(m)
                row += ["" if value is None else repr(float(value)), "", ""]
            if with_dm:
                row += ["" if pub.dm is None else repr(float(pub.dm)), "", "", ""]
            row += [_number(pub.rank), "", "", "", _number(pub.printed_mr), ""]
            body.append(row)
    return header, body


def _protocol_cell(table: PublishedTable | None, group: Group) -> str:
    """yes, no: <the keys that differ>, unknown (no saved config), or "" (no paper's table for its task set)."""
    from mtl_bench.report.compact import protocol_settings
    from mtl_bench.report.published import protocol_gaps

    if table is None:
        return ""
    gaps = protocol_gaps(table, protocol_settings(group))
    return "unknown" if gaps is None else "no: " + "; ".join(gaps) if gaps else "yes"


def _stat_json(stat: Stat, scale: float = 1.0) -> dict[str, Any]:
    out = {"mean": scale * stat.mean, "std": _finite(scale * stat.std), "ci95": _finite(scale * stat.ci), "n": stat.n}
    return {**out, "ci95_below_zero": True} if stat.below_zero else out  # why ci95 is null with several seeds


def problem_line(p: dict[str, Any]) -> str:
    """`diverged: outputs/.../3 (optim=sgd optim.lr=0.05): <reason>`"""
    where = f"{p['path']} ({p['overrides']})" if p["overrides"] else p["path"]
    return f"{p['status']}: {where}: {p['reason']}" if p["reason"] else f"{p['status']}: {where}"


def model_selection(groups: list[Group]) -> str:
    """The runs' model selection, one phrase each (runs of one report normally share it)."""
    found = sorted({selection_text(r.record.model_selection) for g in groups for r in g.runs})
    return ", ".join(found) or "final step"


def footer(
    groups: list[Group],
    problems: list[dict[str, Any]],
    baseline: str | None,
    published: dict[str, PublishedTable] | None = None,
) -> list[str]:
    from mtl_bench.report.compact import TIME_NA, protocol_lines

    repeated = " (runs of one seed averaged first)" if any(len(g.runs) > g.seeds for g in groups) else ""
    lines = protocol_lines(by_task_set(groups), published)
    lines.append(
        f"final test metrics, mean ± 95% confidence interval over seeds{repeated} (Student t: "
        f"± t_0.975,n−1 · s/√n, s the sample std over n seeds; {NA} with one seed); model selection: "
        f"{model_selection(groups)}"
    )
    if any(s.below_zero for g in groups for s in [*_stats(g), g.time_per_step] if s is not None):
        lines.append(f"± {NA} over two or more seeds: {TIME_NA}")
    for tasks, table in (published or {}).items():
        lines.append(
            f"[published] ({tasks}): {table.paper}, {table.table}: its per-metric values as printed (in our units), "
            "Δm as printed"
            + (
                "; MR ↓ recomputed: mean rank with your groups over the paper's metrics; MR printed: the paper's"
                if table.has_metrics
                else "; mean rank: the paper's MR as printed (among its methods only)"
            )
        )
    if baseline:
        lines.append(
            f"Δm against {baseline} (flat: mean over all metrics; task-avg: LibMTL, mean within each "
            "task first; lower is better), ± the 95% CI of each seed's Δm against the baseline's means"
        )
    lines.append(
        "mean rank: each group's rank among the groups on every metric (1 = best, ties share the mean "
        "rank), averaged over the metrics; lower is better"
    )
    if any(g.time_per_step is not None for g in groups):
        lines.append(
            "time/step: each run's wall_time_s / step from its metrics.json (every session of a resumed "
            "run; periodic evaluation and checkpoints included), mean ± 95% CI over seeds; compare on one "
            "machine"
        )
    else:
        lines.append("time/step: no run recorded wall_time_s and step in its metrics.json")
    return lines + _problem_lines(problems)


def _stats(group: Group) -> list[Stat]:
    return [stat for metrics in group.stats.values() for stat in metrics.values()]


def _problem_lines(problems: list[dict[str, Any]]) -> list[str]:
    if not problems:
        return []
    lines = [
        f"not in the table ({len(problems)} run{'s' if len(problems) != 1 else ''} "
        "that did not complete or did not learn; never averaged nor ranked):"
    ]
    return lines + ["  " + problem_line(p) for p in problems]


def _reference_row(part: list[Group], header: list[str]) -> list[str] | None:
    """The task set's reference values (tasks.reference) as a row of the wide table, marked."""
    reference = part[0].runs[0].record.reference or {}
    if not reference:
        return None
    row = ["reference (tasks.reference) [baseline]", ""]
    for title in header[2:]:
        task, _, rest = title.partition("/")
        value = reference.get(task, {}).get(rest.split(" ")[0]) if rest else None
        row.append("" if value is None else significant(float(value), 4))
    return row


def render(
    groups: list[Group],
    problems: list[dict[str, Any]],
    fmt: str,
    baseline: str | None,
    common: list[str],
    *,
    wide: bool = False,
    published: dict[str, Any] | None = None,
) -> str:
    from mtl_bench.report.compact import compact_notes, compact_report, wrap

    parts = by_task_set(groups)
    compact, winners = compact_report(parts, baseline, published, markdown=fmt == "markdown", common=common)
    if fmt == "table" and not wide:
        notes = compact_notes(groups, baseline, published) + [wrap(line) for line in _problem_lines(problems)]
        return compact + "\n" + "\n".join(notes) + "\n"
    if fmt == "json":
        return json.dumps(
            {
                "model_selection": model_selection(groups),
                "baseline": baseline,
                "common_overrides": common,
                "groups": [
                    {
                        "group": g.label,
                        "tags": g.tags,
                        "settings": g.settings,
                        "seeds": g.seeds,
                        "n_runs": len(g.runs),
                        "runs": [str(r.path) for r in g.runs],
                        "baseline_group": g.baseline_label,
                        "delta_m": g.delta_m,
                        "delta_m_ci95": None
                        if g.delta_m_ci is None
                        else {k: _finite(v) for k, v in g.delta_m_ci.items()},
                        "mean_rank": g.mean_rank,
                        "time_per_step_ms": None if g.time_per_step is None else _stat_json(g.time_per_step, 1000.0),
                        "peak_memory": g.peak_memory,
                        "metrics": {t: {m: _stat_json(s) for m, s in ms.items()} for t, ms in g.stats.items()},
                    }
                    for g in groups
                ],
                "winner": winners,
                "published": None
                if not published
                else {
                    tasks: {
                        "paper": t.paper,
                        "table": t.table,
                        "notes": t.notes,
                        "rows": [{**vars(r), "metrics": t.metrics(r) if r.printed else None} for r in t.rows],
                        "protocol": {"experiment": t.experiment, "keys": t.protocol},
                        "groups_off_protocol": _off_protocol_json(parts.get(tasks, []), t),
                        "mean_rank_recomputed": _joint_json(parts.get(tasks, []), t),
                    }
                    for tasks, t in published.items()
                },
                "problems": problems,
            },
            indent=2,
            ensure_ascii=False,
        )
    if fmt == "csv":
        header, body = csv_rows(groups, published)
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(body)
        for p in problems:
            writer.writerow([p["overrides"], "0", p["status"], p["path"], p["reason"]])
        return out.getvalue()
    notes = winners + footer(groups, problems, baseline, published)
    blocks = []
    for tasks, part in parts.items():
        header, body, above = rows(part, (published or {}).get(tasks), common)
        reference = _reference_row(part, header) if baseline == "reference" else None
        if reference is not None:
            body.append(reference + [""] * (len(header) - len(reference)))
        title = f"tasks={tasks}" if len(parts) > 1 else ""
        if fmt == "markdown":
            lines = [f"### {title}", ""] if title else []
            lines += [above, ""] if above else []
            blocks.append("\n".join(lines + markdown_table(header, body)))
        else:
            blocks.append("".join(line + "\n" for line in (title, above or "") if line) + rich_table(header, body))
    if fmt == "markdown":
        return compact + "\n" + "\n\n".join(blocks) + "\n\n" + "\n".join(notes) + "\n"
    return "".join(blocks) + "\n".join(notes) + "\n"


def _off_protocol_json(part: list[Group], table: PublishedTable) -> dict[str, list[str] | None]:
    """Each group that did not run the paper's protocol, with how it differs (None: no saved config to tell)."""
    from mtl_bench.report.compact import protocol_settings
    from mtl_bench.report.published import protocol_gaps

    found = {g.label: protocol_gaps(table, protocol_settings(g)) for g in part}
    return {label: gaps for label, gaps in found.items() if gaps != []}


def _joint_json(part: list[Group], table: Any) -> dict[str, Any] | None:
    """The groups' and the paper's rows' mean ranks among each other (compact.recomputed_ranks), by name."""
    from mtl_bench.report.compact import recomputed_ranks

    joint = recomputed_ranks(part, table)
    if joint is None:
        return None
    return {
        "groups": {g.label: r for g, r in zip(part, joint[0])},
        "published": {row.method: r for row, r in zip(table.rows, joint[1])},
    }
