"""Front learners on Lin et al.'s known front (docs/known_answers.md): every front learner (model/front=cosmos|pamal|
phn) x preference scalarization (balancer=linear|stch|pbi|cosmos, r ~ Dirichlet each step) on tasks=pareto_toy,
beside a sweep of separate fixed-preference runs at equal total steps, measured against the true front.

    python scripts/known_answers_front.py                       # the table (a few minutes on one core)
    python scripts/known_answers_front.py --steps 500 --out DIR  # shorter; keep the run directories

Each front learner trains `--steps` steps and is evaluated at K = `--rays` preferences evenly spaced on the simplex
(trainer.front.rays), Adam at lr 1e-3 (at 1e-2 the networks' first steps throw x where both objectives are flat at
1 and stay there); the separate sweep is K runs of `--steps / K` steps at lr 1e-2 (at 1e-3, 200 steps move x by at
most 0.2 per coordinate), model=decision with x0 uniform in [-0.5, 0.5]^20 as Lin et al.'s code draws it, one run
per preference. Columns: the hypervolume at (1, 1) as a fraction
of what K evenly spaced points of the true front reach ("bound"), and of the continuous front's; "ideal": the same
fraction for the objective's exact optimum at each of the K rays (found on the true front by grid search, formulas
as in balancers/linear.py, stch.py, pbi.py, cosmos.py), so a shortfall of the learner (optimisation) is told apart from
one of the objective (its mu, theta or lambda); IGD to the true front; the largest distance of a point to the true
front; and the part of the Pareto set x = s/sqrt(d) 1 the points cover (s of each point's nearest true point).
"""

from __future__ import annotations

import argparse
import logging
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from mtl_bench.analysis.front_metrics import hypervolume, igd
from mtl_bench.analysis.machine import machine_description
from mtl_bench.api import run
from mtl_bench.tasks.pareto_toy import ParetoToy

REFERENCE = [1.0, 1.0]
LEARNERS = {  # model/front option -> the model options it needs
    "cosmos": ["model.hidden=[100]"],  # COSMOS appends r to the input: x must be a function of it
    "pamal": ["model.init_range=[-0.5,0.5]"],  # its members: two points, drawn as Lin et al. draw x0
    "phn": [],  # the hypernetwork generates x
}
OBJECTIVES = {  # label -> (balancer overrides, parameters for the exact optimum below)
    "linear": (["balancer=linear"], {}),
    "stch mu=0.1": (["balancer=stch"], {"mu": 0.1}),
    "stch mu=0.01": (["balancer=stch", "balancer.mu=0.01"], {"mu": 0.01}),
    "pbi theta=5": (["balancer=pbi"], {"theta": 5.0}),
    "cosmos lambda=1": (["balancer=cosmos"], {"lambda_": 1.0}),
    "cosmos lambda=5": (["balancer=cosmos", "balancer.lambda_=5"], {"lambda_": 5.0}),
}


def objective(label: str, params: dict[str, float], losses: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The scalarization of each row of `losses` (N, 2) at preference r, as the balancers compute it."""
    name = label.split()[0]
    if name == "linear":
        return losses @ r
    if name == "stch":  # mu * logsumexp(r_i L_i / mu)
        z = losses * r / params["mu"]
        top = z.max(axis=1, keepdims=True)
        return params["mu"] * (top[:, 0] + np.log(np.exp(z - top).sum(axis=1)))
    if name == "pbi":  # d1 + theta d2 along the unit preference direction
        d = r / np.linalg.norm(r)
        d1 = losses @ d
        return d1 + params["theta"] * np.sqrt(((losses - d1[:, None] * d) ** 2).sum(axis=1) + 1e-12)
    cos = (losses @ r) / np.maximum(np.linalg.norm(losses, axis=1) * np.linalg.norm(r), 1e-8)
    return losses @ r - params["lambda_"] * cos  # cosmos


def nearest_s(points: list[list[float]], front: np.ndarray) -> list[float]:
    """s of each point's nearest point of the true front (front[i] is at s = -1 + 2 i / (n - 1))."""
    n = len(front)
    return [-1.0 + 2.0 * int(np.argmin(((front - p) ** 2).sum(axis=1))) / (n - 1) for p in points]


def coverage(s: list[float]) -> str:
    """Which part of the Pareto set the points reach: the range of s and its largest gap, or 'ends only'."""
    values = sorted(s)
    if all(abs(v) > 0.9 for v in values):
        ends = sorted({"-1" if v < 0 else "+1" for v in values})
        return f"ends only (s = {' and '.join(ends)})"
    gap = max(b - a for a, b in zip(values, values[1:])) if len(values) > 1 else float("nan")
    return f"s {values[0]:+.2f} .. {values[-1]:+.2f}, largest gap {gap:.2f}"


def train(overrides: list[str], run_dir: Path) -> dict:
    record = run(
        ["tasks=pareto_toy", "model=decision", "logger=csv", "trainer.num_threads=1", *overrides], run_dir
    ).record
    assert record is not None  # the run completed: its metrics.json
    return record.to_dict()


def losses(split: dict) -> list[float]:
    return [split["f1"]["loss"], split["f2"]["loss"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="each front learner's steps (the sweep's in total)")
    parser.add_argument("--rays", type=int, default=10, help="K: preferences evaluated, and runs in the sweep")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate of the front learners")
    parser.add_argument("--separate-lr", type=float, default=1e-2, help="Adam's learning rate of the separate runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: a temp dir)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    k = args.rays
    rays = [[i / (k - 1), 1 - i / (k - 1)] for i in range(k)]  # as trainer.front.rays: Das-Dennis, 2 tasks
    dense = np.array(ParetoToy.true_front(20_001))
    bound = hypervolume(ParetoToy.true_front(k), REFERENCE)
    true_hv = hypervolume(dense.tolist(), REFERENCE)
    print(machine_description())
    print(
        f"true front HV at (1, 1): {true_hv:.4f}; K = {k} evenly spaced true points: {bound:.4f} "
        f"({bound / true_hv:.3f} of it); steps {args.steps} per learner, {args.steps // k} per separate run; "
        f"Adam lr {args.lr} (separate runs {args.separate_lr}); seed {args.seed}\n"
    )
    seed = f"seed={args.seed}"
    out = args.out or Path(tempfile.mkdtemp(prefix="known_answers_front_"))
    rows = []
    for label, (balancer, params) in OBJECTIVES.items():
        ideal = [dense[int(np.argmin(objective(label, params, dense, np.array(r))))].tolist() for r in rays]
        groups: dict[str, tuple[list[list[float]], dict, float]] = {}
        for front, model in LEARNERS.items():
            started = time.time()
            metrics = train(
                [*model, f"model/front={front}", *balancer, "balancer.preference=dirichlet",
                 f"trainer.max_steps={args.steps}", f"trainer.front.rays={k}", f"optim.lr={args.lr}", seed],
                out / f"{front}_{label.replace(' ', '_')}",
            )  # fmt: skip
            groups[front] = ([losses(m) for m in metrics["front"]["test"]], metrics, time.time() - started)
        points, started = [], time.time()
        for i, r in enumerate(rays):
            metrics = train(
                ["model.init_range=[-0.5,0.5]", *balancer, f"balancer.preference={{f1: {r[0]!r}, f2: {r[1]!r}}}",
                 f"trainer.max_steps={args.steps // k}", f"optim.lr={args.separate_lr}", seed],
                out / f"separate_{label.replace(' ', '_')}_{i}",
            )  # fmt: skip
            points.append(losses(metrics["test"]))
        groups[f"separate x{k}"] = (points, metrics, time.time() - started)
        for group, (found, metrics, seconds) in groups.items():
            truth = metrics["true_front"]
            hv = hypervolume(found, truth["reference_point"])
            s = nearest_s(found, np.array(truth["points"]))
            off = max(min(math.dist(p, q) for q in truth["points"]) for p in found)
            rows.append(
                f"| {group} | {label} | {hypervolume(ideal, REFERENCE) / bound:.3f} | {hv / bound:.3f} | "
                f"{hv / truth['hypervolume']:.3f} | {igd(found, truth['points']):.4f} | {off:.4f} | "
                f"{coverage(s)} | {seconds:.0f} |"
            )
            print(rows[-1], flush=True)
    print(
        "\n| learner | objective | ideal / bound | HV / bound | HV / true HV | IGD to true front | max dist. to "
        "front | covered | seconds |\n|---|---|---|---|---|---|---|---|---|"
    )
    print("\n".join(rows))
    print(f"\n{machine_description()}; run directories in {out}")


if __name__ == "__main__":
    main()
