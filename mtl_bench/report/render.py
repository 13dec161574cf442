"""The report as a rich table (terminal), markdown, csv or json."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from mtl_bench.report.summary import Group, by_task_set

FORMATS = ("table", "markdown", "csv", "json")
MODEL_SELECTION = "final step"


def _columns(groups: list[Group]) -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], None] = {}
    for group in groups:
        for task, metrics in group.stats.items():
            for name in metrics:
                seen[(task, name)] = None
    return list(seen)


def _cell(group: Group, task: str, name: str) -> str:
    stat = group.stats.get(task, {}).get(name)
    if stat is None:
        return ""
    return f"{stat.mean:.4g}" if math.isnan(stat.std) else f"{stat.mean:.4g} ± {stat.std:.2g}"


def _arrow(groups: list[Group], task: str, name: str) -> str:
    for group in groups:
        if name in group.higher_is_better.get(task, {}):
            return "↑" if group.higher_is_better[task][name] else "↓"
    return ""


def _dm(group: Group, key: str) -> str:
    return "" if group.delta_m is None else f"{group.delta_m[key]:+.2f}"


def rows(groups: list[Group]) -> tuple[list[str], list[list[str]]]:
    columns = _columns(groups)
    header = ["group", "seeds", *[f"{t}/{m} {_arrow(groups, t, m)}".strip() for t, m in columns]]
    with_dm = any(g.delta_m is not None for g in groups)
    if with_dm:
        header += ["Δm flat % ↓", "Δm task-avg % ↓"]
    body = []
    for group in groups:
        row = [group.label, group.count, *[_cell(group, t, m) for t, m in columns]]
        if with_dm:
            row += [_dm(group, "flat"), _dm(group, "task_averaged")]
        body.append(row)
    return header, body


def problem_line(p: dict[str, Any]) -> str:
    """`diverged: outputs/.../3 (optim=sgd optim.lr=0.05): <reason>`"""
    where = f"{p['path']} ({p['overrides']})" if p["overrides"] else p["path"]
    return f"{p['status']}: {where}: {p['reason']}" if p["reason"] else f"{p['status']}: {where}"


def footer(groups: list[Group], problems: list[dict[str, Any]], baseline: str | None,
           common: list[str]) -> list[str]:
    repeated = " (runs of one seed averaged first)" if any(len(g.runs) > g.seeds for g in groups) else ""
    lines = [f"final test metrics, mean ± sample std over seeds{repeated}; model selection: {MODEL_SELECTION}"]
    if common:
        lines.append("every group also has: " + " ".join(common))
    if baseline:
        lines.append(f"Δm against {baseline} (flat: mean over all metrics; task-avg: LibMTL, mean within each "
                     "task first; lower is better)")
    if problems:
        lines.append(f"not in the table ({len(problems)} run{'s' if len(problems) != 1 else ''} "
                     "that did not complete; never averaged):")
        lines += ["  " + problem_line(p) for p in problems]
    return lines


def render(groups: list[Group], problems: list[dict[str, Any]], fmt: str, baseline: str | None,
           common: list[str]) -> str:
    if fmt == "json":
        return json.dumps({
            "model_selection": MODEL_SELECTION, "baseline": baseline, "common_overrides": common,
            "groups": [{"group": g.label, "settings": g.settings, "seeds": g.seeds, "n_runs": len(g.runs),
                        "runs": [str(r.path) for r in g.runs], "baseline_group": g.baseline_label,
                        "delta_m": g.delta_m,
                        "metrics": {t: {m: {"mean": s.mean, "std": None if math.isnan(s.std) else s.std, "n": s.n}
                                        for m, s in ms.items()} for t, ms in g.stats.items()}}
                       for g in groups],
            "problems": problems,
        }, indent=2, ensure_ascii=False)
    if fmt == "csv":
        header, body = rows(groups)
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(body)
        for p in problems:
            writer.writerow([p["overrides"], "0", p["status"], p["path"], p["reason"]])
        return out.getvalue()
    notes = footer(groups, problems, baseline, common)
    parts = by_task_set(groups)
    blocks = []
    for tasks, part in parts.items():
        header, body = rows(part)
        title = f"tasks={tasks}" if len(parts) > 1 else ""
        if fmt == "markdown":
            lines = [f"### {title}", ""] if title else []
            lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            blocks.append("\n".join(lines + ["| " + " | ".join(row) + " |" for row in body]))
        else:
            blocks.append(_rich_table(header, body, title))
    if fmt == "markdown":
        return "\n\n".join(blocks) + "\n\n" + "\n".join(notes) + "\n"
    return "".join(blocks) + "\n".join(notes) + "\n"


def _rich_table(header: list[str], body: list[list[str]], title: str) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(*header, title=title or None, title_justify="left")
    for row in body:
        table.add_row(*row)
    widths = [max(len(cell) for cell in column) for column in zip(header, *body)]
    console = Console(file=io.StringIO(), width=sum(w + 3 for w in widths) + 1, force_terminal=False)
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]
