"""Matplotlib figures that both the training loop (logged as images) and the report (saved as PNG) draw.

Fronts of per-task losses drawn pairwise: one panel for 2 tasks (the plane), one per pair for more; each front's
points and its non-dominated ones joined, a separate-model front (fixed-preference runs) beside them."""

from __future__ import annotations

import itertools
from typing import Mapping, Optional, Sequence

import numpy as np

from mtl_bench.analysis.front_metrics import Points, non_dominated
from mtl_bench.errors import ConfigError

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "--plots needs matplotlib, a dependency of mtl-bench missing here: pip install matplotlib"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def color(i: int) -> str:
    return f"C{i % 10}"


def marker(i: int) -> str:
    return MARKERS[i % len(MARKERS)]


def front_figure(
    fronts: Mapping[str, Points],
    tasks: Sequence[str],
    separate: Optional[Points] = None,
    title: str = "",
):
    """A matplotlib Figure: `fronts` {label: points (one loss per task)}, `separate` the separate-model front."""
    plt = pyplot()
    pairs = list(itertools.combinations(range(len(tasks)), 2))
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 3.8), squeeze=False)
    drawn = dict(fronts)
    if separate is not None and len(separate):
        drawn = {**drawn, "separate models": separate}
    for ax, (i, j) in zip(axes[0], pairs):
        for k, (label, points) in enumerate(drawn.items()):
            array = np.asarray(points, dtype=float)
            if not len(array):
                continue
            style = (
                dict(color="0.3", marker="x") if label == "separate models" else dict(color=color(k), marker=marker(k))
            )
            ax.scatter(array[:, i], array[:, j], s=14, alpha=0.5, label=label, **style)
            plane = non_dominated(array[:, [i, j]].tolist())
            plane = plane[np.argsort(plane[:, 0])]
            ax.plot(plane[:, 0], plane[:, 1], linewidth=1, color=style["color"])
        ax.set_xlabel(f"{tasks[i]} loss")
        ax.set_ylabel(f"{tasks[j]} loss")
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def figure_pixels(fig) -> np.ndarray:
    """The figure as an (H, W, 3) uint8 array (TensorBoard's image), the figure closed."""
    plt = pyplot()
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return pixels
