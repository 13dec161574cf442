"""Every gradient method of the zoo on the CAGrad/Nash-MTL/FAMO toy (tasks=cagrad_toy), from Nash-MTL's five starts:
the trajectories drawn on the loss contours with the Pareto set (as Nash-MTL's Fig. 1 and CAGrad's Fig. 1) and a table
of where each run ends: its distance to the Pareto set, its stationarity and the trade-off (f1, f2) it reached.

    python scripts/known_answers_toy.py                   # time-compressed: Adam lr 0.05, 700 steps (minutes)
    python scripts/known_answers_toy.py --paper --jobs 8  # Nash-MTL's own: lr 1e-3, 35000 steps (hours on one core)

Each run is `mtl-bench train experiment=cagrad_toy balancer=<method> model.init=<start>` stepped through the engine
(benchmarks/known_answers.py). The papers' methods take their toy scripts' options (CAGrad c = 0.4; FAMO gamma 0 and
min_losses -2.1, -21, as FAMO's run.sh); every other method its conf/balancer YAML. The default is not the papers'
experiment: it lets Adam travel as far (lr x steps = 35, as Nash-MTL's 1e-3 x 35000) in 50x larger steps, so that
the whole zoo runs in minutes, and that changes where runs end. Adam's second moment remembers about 1000 steps
(beta2 0.999), the whole of a 700-step run, so early large gradients slow the last steps; and large steps cross the
narrow valleys of the log terms (x2 > 0) that small steps follow. Measured: LS from (9, 9) ends 0.9 from the Pareto
set here and 12.35 from it (in the x2 > 0 valley) at the papers' length. `--paper` runs that length: about 3.4 ms a
step for LS, 5-25 ms for the methods with a host solve, so about 5 hours for the zoo on one core. Writes the
figures to --img-dir and the table to stdout (and --md FILE).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from benchmarks.known_answers import NASH_STARTS, engine_trajectory, start_override
from mtl_bench.analysis.machine import machine_description
from mtl_bench.tasks.cagrad_toy import distance_to_polyline, objectives, pareto_set, stationarity

# The papers' methods with their toy scripts' options (Nash-MTL's experiments/toy; FAMO's run.sh).
PAPERS = {
    "fixed": ["balancer=fixed"],  # LS: the sum of the losses
    "mgda": ["balancer=mgda"],
    "pcgrad": ["balancer=pcgrad"],
    "cagrad": ["balancer=cagrad", "balancer.c=0.4", "balancer.rescale=1"],
    "nash_mtl": ["balancer=nash_mtl"],
    "famo": ["balancer=famo", "balancer.gamma=0.0", "balancer.min_losses={f1:-2.1,f2:-21.0}"],
}
# The rest of the zoo's gradient methods (docs/methods.md, kind gradient), at their YAML defaults.
OTHERS = [
    "aligned_mtl",
    "con_fig",
    "cr_mogm",
    "db_mtl",
    "dualproj",
    "excess_mtl",
    "fairgrad",
    "graddrop",
    "gradnorm",
    "gradvac",
    "gramian",
    "imtl",
    "moco",
    "modo",
    "pcd",
    "sdmgrad",
    "upgrad",
]
SKIPPED = {
    "krum": "refuses T = 2 (its n_byzantine must be at most T - 3)",
    "trimmed_mean": "with T = 2 it may trim nothing (trim at most (T - 1) // 2 = 0): the mean of the gradients, LS",
    "auto_lambda, forum, moml": "bilevel: they draw validation batches, and a problem without data has none",
    "cosmos, linear, pbi, stch": "preference scalarizations for the front learners (docs/pareto_front.md)",
    "dwa, gls, rescaled_norm, rlw, si, uw": "loss weightings, not gradient methods (gls and si take logs of the "
    "losses, which are negative here)",
}
METHODS = {**PAPERS, **{m: [f"balancer={m}"] for m in OTHERS}}
LABELS = {"fixed": "LS (fixed)"}


def run(method: str, start: tuple[float, float], steps: int, lr: float) -> tuple[np.ndarray, float]:
    torch.set_num_threads(1)
    began = time.perf_counter()
    path = engine_trajectory([*METHODS[method], start_override(start), f"optim.lr={lr}"], steps)
    return path, time.perf_counter() - began


def summary(end: np.ndarray, curve: torch.Tensor) -> dict[str, float]:
    x = torch.from_numpy(end[None]).double()
    f = objectives(x, 0.1)[0]
    return {
        "dist": float(distance_to_polyline(x, curve)[0]),
        "stationarity": float(stationarity(x, 0.1)[0]),
        "f1": float(f[0]),
        "f2": float(f[1]),
    }


def draw(paths: dict[str, list[np.ndarray]], img_dir: Path, note: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = pareto_set(401)
    front = objectives(torch.from_numpy(curve), 0.1).numpy()
    grid = np.linspace(-10, 10, 201)
    xx, yy = np.meshgrid(grid, grid)
    mean = objectives(torch.from_numpy(np.stack([xx, yy], -1)), 0.1).numpy().mean(-1)
    colours = plt.get_cmap("tab10")(np.arange(len(NASH_STARTS)))
    n = len(paths)
    cols = 6
    rows = -(-n // cols)
    written = []
    for kind in ("x", "losses"):
        fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.6 * rows), squeeze=False)
        for ax, (method, runs) in zip(axes.flat, paths.items()):
            if kind == "x":
                ax.contour(xx, yy, mean, levels=12, linewidths=0.5, cmap="viridis")
                ax.plot(curve[:, 0], curve[:, 1], color="0.5", linewidth=4, zorder=1)
            else:
                ax.plot(front[:, 0], front[:, 1], color="0.5", linewidth=4, zorder=1)
            for colour, path in zip(colours, runs):
                pts = path if kind == "x" else objectives(torch.from_numpy(path), 0.1).numpy()
                ax.plot(pts[:, 0], pts[:, 1], color=colour, linewidth=1)
                ax.plot(pts[0, 0], pts[0, 1], "o", color="k", markersize=3)
                ax.plot(pts[-1, 0], pts[-1, 1], "*", color=colour, markersize=7)
            ax.set_title(LABELS.get(method, method), fontsize=9)
            ax.tick_params(labelsize=6)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        what = "x (contours: (f1 + f2)/2; grey: the Pareto set)" if kind == "x" else "(f1, f2) (grey: the Pareto front)"
        fig.suptitle(f"tasks=cagrad_toy, five starts (black dots) to their ends (stars), in {what}; {note}", fontsize=9)
        fig.tight_layout()
        out = img_dir / f"cagrad_toy_{kind}.png"
        fig.savefig(out, dpi=72)
        plt.close(fig)
        written.append(out)
    return written


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--paper", action="store_true", help="Nash-MTL's own length: lr 1e-3, 35000 steps")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated conf/balancer options")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (processes, one thread each)")
    parser.add_argument("--img-dir", type=Path, default=Path("docs/img"))
    parser.add_argument("--md", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    steps, lr = (35000, 1e-3) if args.paper else (args.steps, args.lr)
    torch.set_num_threads(1)  # as each run (the machine line reports it)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: {', '.join(unknown)} not among {', '.join(METHODS)}")
    jobs = [(m, start) for m in methods for start in NASH_STARTS]
    began = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run, *zip(*jobs), [steps] * len(jobs), [lr] * len(jobs)))
    wall = time.perf_counter() - began
    curve = torch.from_numpy(pareto_set()).double()
    paths: dict[str, list[np.ndarray]] = {m: [] for m in methods}
    seconds: dict[str, float] = {m: 0.0 for m in methods}
    lines = [
        f"Adam lr {lr:g}, {steps} steps, from Nash-MTL's five starts; tasks.scale=0.1",
        f"machine: {machine_description()}; {args.jobs} job(s); wall {wall:.0f} s",
        "",
        "| method | ms/step | start | end x | distance to the Pareto set | stationarity | f1 | f2 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (method, start), (path, secs) in zip(jobs, results):
        paths[method].append(path)
        seconds[method] += secs
    for method in methods:
        per_step = 1000 * seconds[method] / (steps * len(NASH_STARTS))
        for start, path in zip(NASH_STARTS, paths[method]):
            s = summary(path[-1], curve)
            end = f"({path[-1][0]:.2f}, {path[-1][1]:.2f})"
            lines.append(
                f"| {LABELS.get(method, method)} | {per_step:.1f} | {start} | {end} | {s['dist']:.3f} | "
                f"{s['stationarity']:.1e} | {s['f1']:.3f} | {s['f2']:.3f} |"
            )
    lines += ["", "Skipped:"] + [f"- {name}: {why}" for name, why in SKIPPED.items()]
    table = "\n".join(lines)
    print(table)
    if args.md is not None:
        args.md.write_text(table + "\n")
    if os.environ.get("MPLBACKEND") != "none":
        args.img_dir.mkdir(parents=True, exist_ok=True)
        for out in draw(paths, args.img_dir, f"Adam lr {lr:g}, {steps} steps"):
            print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
