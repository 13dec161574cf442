"""PNG plots of a report: loss weights over training per group, metric bars with error bars, two-task trade-off."""

from __future__ import annotations

import math
from pathlib import Path

from mtl_bench.errors import ConfigError
from mtl_bench.report.summary import Group, by_task_set


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plots needs matplotlib: pip install 'mtl-bench[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def primary_metric(group: Group, task: str) -> str:
    """The first metric a task reports (its table column), used for the trade-off plot."""
    return next(iter(group.stats[task]))


def write_plots(groups: list[Group], out_dir: Path) -> list[Path]:
    """weights.png, metrics.png and (two tasks) tradeoff.png; `-<task set>` added when there are several."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = by_task_set(groups)
    written = []
    for name, part in parts.items():
        suffix = f"-{name}" if len(parts) > 1 else ""
        written += [_weights(plt, part, out_dir / f"weights{suffix}.png"),
                    _bars(plt, part, out_dir / f"metrics{suffix}.png")]
        tasks = list(part[0].stats)
        if len(tasks) == 2:
            written.append(_tradeoff(plt, part, tasks, out_dir / f"tradeoff{suffix}.png"))
    return written


def _weights(plt, groups: list[Group], path: Path) -> Path:
    """weight/<task> over steps, from the first seed of each group (TensorBoard event files)."""
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 2.6 * len(groups)), squeeze=False, sharex=True)
    for ax, group in zip(axes[:, 0], groups):
        for tag, points in sorted(group.runs[0].scalars("weight/").items()):
            ax.plot([s for s, _ in points], [v for _, v in points], label=tag.split("/", 1)[1])
        ax.set_title(group.label, fontsize=9)
        ax.set_ylabel("loss weight")
        if ax.get_lines():  # runs without TensorBoard files have nothing to draw
            ax.legend(fontsize=7, ncol=5)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(plt, groups: list[Group], path: Path) -> Path:
    columns = [(t, m) for t, metrics in groups[0].stats.items() for m in metrics]
    fig, axes = plt.subplots(1, len(columns), figsize=(3.2 * len(columns), 3.6), squeeze=False)
    for ax, (task, name) in zip(axes[0], columns):
        stats = [g.stats.get(task, {}).get(name) for g in groups]
        means = [s.mean if s else math.nan for s in stats]
        errors = [0.0 if (s is None or math.isnan(s.std)) else s.std for s in stats]
        ax.bar(range(len(groups)), means, yerr=errors, capsize=3, color=[f"C{i}" for i in range(len(groups))])
        ax.set_title(f"{task}/{name}", fontsize=9)
        ax.set_xticks(range(len(groups)), [str(i + 1) for i in range(len(groups))])
    fig.legend([plt.Rectangle((0, 0), 1, 1, color=f"C{i}") for i in range(len(groups))],
               [f"{i + 1}: {g.label}" for i, g in enumerate(groups)], loc="lower center", fontsize=7,
               ncol=min(3, len(groups)))
    fig.tight_layout(rect=(0, 0.08 + 0.03 * math.ceil(len(groups) / 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _tradeoff(plt, groups: list[Group], tasks: list[str], path: Path) -> Path:
    """Each seed as a faint point, each group's mean as a large one: the two tasks' trade-off (Pareto view)."""
    mx, my = primary_metric(groups[0], tasks[0]), primary_metric(groups[0], tasks[1])
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, group in enumerate(groups):
        xs = [r.metrics["test"][tasks[0]][mx] for r in group.runs]
        ys = [r.metrics["test"][tasks[1]][my] for r in group.runs]
        ax.scatter(xs, ys, color=f"C{i}", alpha=0.3, s=15)
        ax.scatter([group.stats[tasks[0]][mx].mean], [group.stats[tasks[1]][my].mean], color=f"C{i}", s=60,
                   label=group.label, edgecolors="black")
    hib = groups[0].higher_is_better
    ax.set_xlabel(f"{tasks[0]}/{mx} ({'higher' if hib[tasks[0]][mx] else 'lower'} is better)")
    ax.set_ylabel(f"{tasks[1]}/{my} ({'higher' if hib[tasks[1]][my] else 'lower'} is better)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
