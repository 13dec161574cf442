"""PNG plots of a report, one set per task set:

- weights.png: loss weights over training, one panel per group (its first seed), a log axis when they span
  orders of magnitude, a line style, marker and legend entry per task so equal weights stay visible;
- metrics.png: one panel per metric with its own axis (not from 0): each group's mean with its 95% CI over
  seeds and each seed as a faint dot;
- delta_m_vs_time.png (with --baseline; rank_vs_time.png without): Δm (or the mean rank) against the measured
  training time per step, one labelled point per group with CI error bars;
- tradeoff.png (two tasks): each seed and each group mean with its CI in the plane of the two tasks' first
  metrics, and the Pareto front of the group means.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

from mtl_bench.figures import color, marker
from mtl_bench.figures import pyplot as _pyplot
from mtl_bench.report.summary import Group, Stat, by_task_set

LINESTYLES = ("-", "--", ":", "-.")
SPAN = 10.0  # a positive axis whose values span this factor or more is drawn on a log scale


def primary_metric(group: Group, task: str) -> str:
    """The first metric a task reports (its table column), used for the trade-off plot."""
    return next(iter(group.stats[task]))


def _finite(values: Sequence[Optional[float]]) -> list[float]:
    return [v for v in values if v is not None and not math.isnan(v)]


def spans_orders(values: Sequence[Optional[float]]) -> bool:
    """Whether the values are all positive and the largest is at least SPAN times the smallest."""
    values = _finite(values)
    return bool(values) and min(values) > 0 and max(values) >= SPAN * min(values)


def _scale(ax, axis: str, values: Sequence[Optional[float]]) -> None:
    """Log scale for positive values spanning orders of magnitude; symlog when some are <= 0 and the nonzero
    magnitudes still span orders of magnitude; linear otherwise."""
    from matplotlib.ticker import LogFormatter, MaxNLocator

    class Plain(LogFormatter):  # 0.01, 2, 20 rather than 10⁻², 2×10⁰; LogFormatter picks which ticks get a label
        def __call__(self, x, pos=None):
            return f"{x:g}" if super().__call__(x, pos) else ""

    finite = _finite(values)
    setter = ax.set_yscale if axis == "y" else ax.set_xscale
    target = ax.yaxis if axis == "y" else ax.xaxis
    if spans_orders(finite):
        setter("log")
        target.set_major_formatter(Plain())
        target.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        return
    if finite and min(finite) <= 0:
        nonzero = [abs(v) for v in finite if v != 0]
        if nonzero and max(nonzero) >= 100 * min(nonzero):
            setter("symlog", linthresh=min(nonzero))
            return
    target.set_major_locator(MaxNLocator(nbins=5))
    ax.ticklabel_format(axis=axis, style="sci", scilimits=(-3, 4), useOffset=False)  # 1.9 ×10⁻³, not 0.00190


def _ci(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def write_plots(groups: list[Group], out_dir: Path, baseline: Optional[str] = None) -> list[Path]:
    """weights.png, metrics.png, delta_m_vs_time.png (rank_vs_time.png without Δm; left out when no run recorded
    its time) and, with two tasks, tradeoff.png; `-<task set>` added to each name when there are several."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = by_task_set(groups)
    written = []
    for name, part in parts.items():
        suffix = f"-{name}" if len(parts) > 1 else ""
        written += [
            _weights(plt, part, out_dir / f"weights{suffix}.png"),
            _metrics(plt, part, out_dir / f"metrics{suffix}.png"),
        ]
        if any(g.time_per_step is not None for g in part):
            stem = "delta_m_vs_time" if any(g.delta_m is not None for g in part) else "rank_vs_time"
            written.append(_cost(plt, part, out_dir / f"{stem}{suffix}.png", baseline))
        tasks = list(part[0].stats)
        if len(tasks) == 2:
            written.append(_tradeoff(plt, part, tasks, out_dir / f"tradeoff{suffix}.png"))
    return written


def _save(plt, fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _weights(plt, groups: list[Group], path: Path) -> Path:
    """weight/<task> over steps, from the first seed of each group (its logged scalars, TensorBoard or CSV).

    Each task has its own colour, line style and marker, and lines drawn later are thinner, so tasks with equal
    weights show as overlapping but distinct lines; markers are staggered along the steps for the same reason.
    """
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 2.5 * len(groups) + 0.4), squeeze=False, sharex=True)
    for ax, group in zip(axes[:, 0], groups):
        run = group.runs[0]
        curves = sorted(run.scalars("weight/").items())
        n = len(curves)
        for i, (tag, points) in enumerate(curves):
            steps, values = [s for s, _ in points], [v for _, v in points]
            every = max(1, len(points) // 8)
            ax.plot(
                steps,
                values,
                label=tag.split("/", 1)[1],
                color=color(i),
                linestyle=LINESTYLES[(i // 10 + i) % 4],
                marker=marker(i),
                markersize=5,
                markevery=(i * every // max(n, 1) % every, every),
                linewidth=2.8 - 1.8 * i / max(n - 1, 1),
                alpha=0.9,
            )
        _scale(ax, "y", [v for _, points in curves for _, v in points])
        seed = f" (seed {run.seed})" if run.seed is not None else ""
        ax.set_title(f"{group.label}{seed}", fontsize=9)
        ax.set_ylabel("loss weight" + (" (log)" if ax.get_yscale() == "log" else ""))
        ax.grid(True, which="major", alpha=0.3)
        if curves:
            ax.legend(
                fontsize=7,
                ncol=1 if n <= 12 else math.ceil(n / 12),
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
                borderaxespad=0,
                title="task",
                title_fontsize=7,
            )
        else:  # runs without TensorBoard files have nothing to draw
            ax.text(
                0.5,
                0.5,
                f"no weight/<task> scalars in {run.path.name}'s TensorBoard files",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=8,
                color="0.4",
            )
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    return _save(plt, fig, path)


def _metrics(plt, groups: list[Group], path: Path) -> Path:
    """One panel per metric, each with its own axis fitted to the values: group means with 95% CI bars and every
    seed as a faint dot; a log axis where the values span orders of magnitude."""
    columns = list(dict.fromkeys((t, m) for g in groups for t, metrics in g.stats.items() for m in metrics))
    ncols = min(3, len(columns))
    nrows = math.ceil(len(columns) / ncols)
    labels = [g.label for g in groups]
    width = min(9.0, 0.065 * max(len(label) for label in labels) + 1.0)  # room for the group names
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(width + 3.3 * ncols, 0.9 + nrows * (0.35 * len(groups) + 1.1)),
        squeeze=False,
        sharey=True,
    )
    ys = list(range(len(groups)))
    for k, (ax, (task, name)) in enumerate(zip(axes.flat, columns)):
        higher = next(
            (g.higher_is_better[task][name] for g in groups if name in g.higher_is_better.get(task, {})), None
        )
        values: list[float] = []
        for i, group in enumerate(groups):
            stat = group.stats.get(task, {}).get(name)
            if stat is None:
                continue
            ax.scatter(
                stat.values,
                [i + 0.25] * len(stat.values),
                color=color(i),
                alpha=0.5,
                s=16,
                marker=marker(i),
                linewidths=0,
            )  # just under the mean's bar
            ax.errorbar(
                [stat.mean],
                [i],
                xerr=[[_ci(stat.ci)], [_ci(stat.ci)]],
                color=color(i),
                marker=marker(i),
                markersize=7,
                markeredgecolor="black",
                capsize=4,
                linewidth=1.6,
            )
            values += [*stat.values, stat.mean - _ci(stat.ci), stat.mean + _ci(stat.ci)]
        _scale(ax, "x", values)
        direction = "" if higher is None else (" ↑ higher is better" if higher else " ↓ lower is better")
        ax.set_title(f"{task}/{name}{direction}", fontsize=9)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
        if k % ncols == 0:
            ax.set_yticks(ys, labels, fontsize=8)
    for ax in list(axes.flat)[len(columns) :]:
        ax.set_visible(False)
    axes[0, 0].set_ylim(len(groups) - 0.5, -0.5)  # the table's order, top to bottom
    fig.suptitle(
        "final test metrics: group mean ± 95% CI over seeds (Student t; no bar: one seed), faint: each seed", fontsize=9
    )
    fig.tight_layout()
    return _save(plt, fig, path)


def _cost(plt, groups: list[Group], path: Path, baseline: Optional[str] = None) -> Path:
    """Δm (both conventions when they differ; mean rank without a baseline) against the measured time per step:
    one labelled point per group, error bars from the 95% CIs over seeds."""
    with_dm = any(g.delta_m is not None and g.time_per_step is not None for g in groups)
    # per group: its index (colour, marker), time per step, and {convention: (y, y's CI half-width)}
    shown: list[tuple[int, Group, Stat, dict[str, tuple[float, float]]]] = []
    for i, g in enumerate(groups):
        if g.time_per_step is None:
            continue
        if with_dm and g.delta_m is not None:
            ci = g.delta_m_ci or {}
            shown.append((i, g, g.time_per_step, {k: (v, _ci(ci.get(k, math.nan))) for k, v in g.delta_m.items()}))
        elif not with_dm and g.mean_rank is not None:
            shown.append((i, g, g.time_per_step, {"rank": (g.mean_rank, 0.0)}))
    if with_dm:
        keys = ["flat"] + (
            ["task_averaged"]
            if any(not math.isclose(ys["flat"][0], ys["task_averaged"][0], abs_tol=1e-9) for *_, ys in shown)
            else []
        )
    else:
        keys = ["rank"]
    fig, axes = plt.subplots(1, len(keys), figsize=(6.6 * len(keys), 4.8), squeeze=False)
    labels = []
    for ax, key in zip(axes[0], keys):
        points: list[tuple[float, float, str, str]] = []
        for i, group, t, ys in shown:
            y, yerr = ys[key]
            ax.errorbar(
                [1000 * t.mean],
                [y],
                xerr=[[1000 * _ci(t.ci)], [1000 * _ci(t.ci)]],
                yerr=[[yerr], [yerr]],
                color=color(i),
                marker=marker(i),
                markersize=8,
                markeredgecolor="black",
                capsize=4,
                linestyle="none",
                label=group.label,
            )
            points.append((1000 * t.mean, y, group.label, color(i)))
        _scale(ax, "x", [1000 * t.mean for _, _, t, _ in shown])
        if ax.get_xscale() == "linear" and ax.get_xlim()[0] < 0:
            ax.set_xlim(left=0.0)  # an interval past 0 ms says how noisy the timing is, not that time was negative
        ax.set_xlabel("training time per step, ms (wall_time_s / step; mean ± 95% CI over seeds)")
        if key == "rank":
            ax.set_ylabel("mean rank over the metrics (lower is better)")
        else:
            ax.axhline(0.0, color="0.5", linewidth=1, linestyle="--")
            ax.set_ylabel(f"Δm {'flat' if key == 'flat' else 'task-avg'} % (lower is better; ± 95% CI)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        labels.append((ax, points))
    missing = [g.label for g in groups if all(g is not s for _, s, _, _ in shown)]
    title = "lower left: better and cheaper"
    if with_dm:
        title = f"Δm against {baseline or 'the baseline'} ({title})"
    if missing:
        title += f"\nnot shown (no time recorded{' or no Δm' if with_dm else ''}): " + ", ".join(missing)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    for ax, points in labels:  # once the layout is final, so that overlaps are measured where they will be
        _label_points(fig, ax, points)
    return _save(plt, fig, path)


def _label_points(fig, ax, points: list[tuple[float, float, str, str]]) -> None:
    """Write each point's label beside it (towards the middle of the axes), at the first of a few offsets where it
    overlaps no label already placed."""
    renderer = fig.canvas.get_renderer()
    placed: list = []
    offsets = [
        (7, 5, "left"),
        (7, -12, "left"),
        (-7, 5, "right"),
        (-7, -12, "right"),
        (7, 14, "left"),
        (7, -21, "left"),
    ]
    for x, y, text, colour in points:
        fx, _ = ax.transAxes.inverted().transform(ax.transData.transform((x, y)))
        order = offsets if fx < 0.6 else [(-dx, dy, "right" if ha == "left" else "left") for dx, dy, ha in offsets]
        for k, (dx, dy, ha) in enumerate(order):
            label = ax.annotate(
                text, (x, y), textcoords="offset points", xytext=(dx, dy), ha=ha, fontsize=7, color=colour
            )
            box = label.get_window_extent(renderer)
            if k == len(offsets) - 1 or not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            label.remove()


def pareto_front(points: list[tuple[float, float]], higher: tuple[bool, bool]) -> list[int]:
    """Indices of the points no other point beats or equals on both axes while beating on one."""
    sign = [1.0 if h else -1.0 for h in higher]

    def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
        better = [sign[k] * a[k] >= sign[k] * b[k] for k in range(2)]
        strictly = [sign[k] * a[k] > sign[k] * b[k] for k in range(2)]
        return all(better) and any(strictly)

    return [i for i, p in enumerate(points) if not any(dominates(q, p) for j, q in enumerate(points) if j != i)]


def _tradeoff(plt, groups: list[Group], tasks: list[str], path: Path) -> Path:
    """Each seed as a faint point, each group's mean with its 95% CIs as a large one, and the Pareto front of the
    group means: the two tasks' trade-off."""
    mx, my = primary_metric(groups[0], tasks[0]), primary_metric(groups[0], tasks[1])
    hib = groups[0].higher_is_better
    fig, ax = plt.subplots(figsize=(7, 5))
    means, xs_all, ys_all = [], [], []
    for i, group in enumerate(groups):
        sx, sy = group.stats[tasks[0]][mx], group.stats[tasks[1]][my]
        ax.scatter(sx.values, sy.values, color=color(i), marker=marker(i), alpha=0.3, s=18)
        ax.errorbar(
            [sx.mean],
            [sy.mean],
            xerr=[[_ci(sx.ci)], [_ci(sx.ci)]],
            yerr=[[_ci(sy.ci)], [_ci(sy.ci)]],
            color=color(i),
            marker=marker(i),
            markersize=9,
            markeredgecolor="black",
            capsize=4,
            linestyle="none",
            label=group.label,
        )
        means.append((sx.mean, sy.mean))
        xs_all += sx.values + [sx.mean - _ci(sx.ci), sx.mean + _ci(sx.ci)]
        ys_all += sy.values + [sy.mean - _ci(sy.ci), sy.mean + _ci(sy.ci)]
    higher = (bool(hib.get(tasks[0], {}).get(mx, False)), bool(hib.get(tasks[1], {}).get(my, False)))
    front = sorted((means[i] for i in pareto_front(means, higher)), key=lambda p: p[0])
    if len(groups) > 1:
        ax.plot(
            [p[0] for p in front],
            [p[1] for p in front],
            color="0.3",
            linestyle="--",
            linewidth=1,
            zorder=0,
            label="Pareto front of the group means",
        )
    _scale(ax, "x", xs_all)
    _scale(ax, "y", ys_all)
    ax.set_xlabel(f"{tasks[0]}/{mx} ({'higher' if higher[0] else 'lower'} is better)")
    ax.set_ylabel(f"{tasks[1]}/{my} ({'higher' if higher[1] else 'lower'} is better)")
    ax.set_title("group mean ± 95% CI over seeds; faint: each seed", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return _save(plt, fig, path)
