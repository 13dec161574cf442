"""`mtl-bench report <study dir>`: the study's table from study.json (no torch), at most 100 columns wide."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Optional

from mtl_bench.errors import ConfigError
from mtl_bench.report.tables import aligned_table, markdown_table
from mtl_bench.study.spec import SCALARIZATION, SINGLE_TASK

WIDTH = 100
HEADER = ["method", "n", "test Δm % ↓", "vs scal. Δm", "p Holm", "MDE", "rank", "ms/step", "peak MiB", "{unit}"]
# The CSV form: numbers, not display strings (empty: not available).
CSV_HEADER = [
    "method",
    "n",
    "seeds_planned",
    "delta_m",
    "delta_m_ci95",
    "vs_scalarization",
    "vs_scalarization_ci95",
    "p",
    "p_holm",
    "detectable_difference",
    "mean_rank",
    "ms_per_step",
    "peak_mib",
    "{unit}",
]


def is_study_dir(path: Path) -> bool:
    return (path / "study.json").is_file() or (path / "study.yaml").is_file()


def load_results(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "study.json").read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no study.json yet (the study has not finished): rerun its `mtl-bench study` command"
        ) from None
    except ValueError as err:
        raise ConfigError(f"{path / 'study.json'}: not JSON ({err})") from None


def _n(x: Optional[float], fmt: str) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _short(x: float, sign: str = "") -> str:
    """Three significant digits in the table's columns (two decimals below 10, one above)."""
    return format(x, f"{sign}.{2 if abs(x) < 10 else 1}f")


def _pm(stat: Optional[dict[str, Any]]) -> str:
    if not stat or stat.get("mean") is None:
        return ""
    ci = stat.get("ci95")
    return f"{_short(stat['mean'], '+')} ± {'n/a' if ci is None else _short(ci)}"


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    body = []
    rows = results["rows"]
    for name, row in rows.items():
        if name == SINGLE_TASK:
            continue
        vs = row.get("vs_scalarization")
        mark = {-1: " <", 1: " >"}.get(vs.get("separated", 0), "") if vs else ""
        n = (row.get("delta_m") or {}).get("n")
        body.append(
            [
                name,
                "" if n is None else f"{n}/{row.get('seeds_planned', n)}",
                _pm(row.get("delta_m")),
                "(baseline)" if name == SCALARIZATION else _pm(vs) + mark,
                _n(vs.get("p_holm"), ".3f") if vs else "",
                "" if not vs or vs.get("detectable") is None else _short(vs["detectable"]),
                _n(row.get("mean_rank"), ".2f"),
                _n(row.get("time_per_step_ms"), ".3g"),
                _n(row.get("peak_memory_mib"), ".0f"),
                _n(row.get("compute", {}).get("total"), ".3f"),
            ]
        )
    if SINGLE_TASK in rows:
        total = _n(rows[SINGLE_TASK]["compute"]["total"], ".3f")
        body.append(["single-task", "", "reference", "", "", "", "", "", "", total])
    return body


def csv_rows(results: dict[str, Any]) -> list[list[Any]]:
    def num(x: Any) -> Any:
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else x

    body: list[list[Any]] = []
    for name, row in results["rows"].items():
        dm, vs = row.get("delta_m") or {}, row.get("vs_scalarization") or {}
        body.append(
            [
                name,
                num(dm.get("n")),
                num(row.get("seeds_planned")),
                num(dm.get("mean")),
                num(dm.get("ci95")),
                num(vs.get("mean")),
                num(vs.get("ci95")),
                num(vs.get("p")),
                num(vs.get("p_holm")),
                num(vs.get("detectable")),
                num(row.get("mean_rank")),
                num(row.get("time_per_step_ms")),
                num(row.get("peak_memory_mib")),
                num((row.get("compute") or {}).get("total")),
            ]
        )
    return body


def outcome_lines(results: dict[str, Any]) -> list[str]:
    """The final runs that did not finish, diverged or did not learn, by row: none is dropped silently."""
    lines = []
    for name, row in results["rows"].items():
        outcomes = row.get("outcomes") or {}
        if outcomes:
            shown = ", ".join(f"s{seed} {status}" for seed, status in outcomes.items())
            lines.append(f"{name}: {shown}")
    if not lines:
        return []
    return [
        "final runs not completed or flagged (failed, diverged and unfinished runs have no Δm; runs that did not "
        "learn are counted in n and averaged; why: study.json, problems): " + "; ".join(lines)
    ]


def footer(results: dict[str, Any]) -> list[str]:
    reference = results["reference"]
    ref = (
        "the study's single-task runs (one run per task, the same model with that task alone, lr tuned with the "
        "same budget), test metrics averaged over the final seeds"
        if reference["kind"] == "single_task"
        else "the task set's published reference (tasks.reference)"
    )
    memory = next((r.get("peak_memory_kind") for r in results["rows"].values() if r.get("peak_memory_kind")), None)
    lines = [
        f"study {results['study']}: tasks {', '.join(results['tasks'])}; {results['budget']} tuning trials per row "
        f"(seed {results['tune_seed']}, chosen on validation {results['select']}), final seeds "
        f"{', '.join(map(str, results['seeds']))}",
        f"Δm: flat mean relative drop over the test metrics (%, lower is better) against {ref}; "
        "± 95% t interval over seeds",
        "n: final runs with test metrics / final seeds; vs scal.: per-seed Δm minus tuned scalarization's, paired by "
        "seed, mean ± 95% CI (none below 2 seeds); p Holm: paired t test, Holm-corrected over the methods; < / > "
        "better / worse with separation",
        "MDE: the minimum detectable effect, the smallest paired difference (Δm points) the seeds detect with 80% "
        "power (paired t test at "
        "Holm's strictest level 0.05 / methods compared; statsmodels TTestPower, observed SD of the differences)",
        "rank: mean rank over the test metrics; ms/step: training wall time / steps of the final runs"
        + (f"; peak MiB: {memory}, largest over the final runs" if memory else ""),
        f"{results['compute_unit']}: tuning + final runs' training wall time"
        + (" × threads" if results["compute_unit"] == "core-hours" else "")
        + "; single-task: all its tasks' runs",
        *outcome_lines(results),
        results["verdict"],
        f"machine (when the runs ran): {results.get('machine', 'not recorded')}",
    ]
    return lines


def wrap(line: str, width: int = WIDTH) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(line, width, subsequent_indent="  ")) or line


def render_study(results: dict[str, Any], fmt: str) -> str:
    header = [h.format(unit=results["compute_unit"]) for h in HEADER]
    body = table_rows(results)
    if fmt == "json":
        return json.dumps(results, indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        csv.writer(out).writerows([[h.format(unit=results["compute_unit"]) for h in CSV_HEADER], *csv_rows(results)])
        return out.getvalue()
    if fmt == "markdown":
        lines = markdown_table(header, body)
        return "\n".join(lines) + "\n\n" + "\n".join(f"- {line}" for line in footer(results)) + "\n"
    return "\n".join(aligned_table(header, body)) + "\n" + "\n".join(wrap(line) for line in footer(results)) + "\n"


def write_study_plot(results: dict[str, Any], folder: Path) -> Path:
    """Δm against time per step, each method a point with its 95% CI (bars: over the final seeds)."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plots needs matplotlib: pip install matplotlib") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, row in results["rows"].items():
        dm, t = row.get("delta_m"), row.get("time_per_step_ms")
        if not dm or dm.get("mean") is None or t is None:
            continue
        ci = dm.get("ci95") or 0.0
        ax.errorbar([t], [dm["mean"]], yerr=[[ci], [ci]], fmt="o", capsize=3)
        ax.annotate(name, (t, dm["mean"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("time per step (ms, final runs)")
    ax.set_ylabel("test Δm % (lower is better), 95% CI")
    ax.set_title(f"study {results['study']}")
    ax.axhline(0, color="grey", lw=0.5)
    path = folder / f"study_{results['study']}_delta_m_vs_time.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
