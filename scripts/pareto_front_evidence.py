"""The Pareto-front evidence of docs/pareto_front.md: COSMOS, PHN and PaMaL against a sweep of fixed-preference
linear scalarizations (separate models) at equal total steps, tasks=digits (3 tasks), 3 seeds.

    python scripts/pareto_front_evidence.py --out DIR            # run the sweeps, then report
    python scripts/pareto_front_evidence.py --out DIR --collect  # only report finished sweeps

Defaults: LeNet as experiment=digits_lenet trains it (1,500 steps of 128 pairs, Adam lr 1e-3) with the sum standardised
(tasks.standardize_sum=true; the hypervolume's reference point for the sum then 1.25 in loss units, a bit worse
than a constant predictor's 1.0); `--model mlp --steps 800 --raw-sum` is the earlier, smaller setting.

Each front model trains `--steps` steps (experiment=digits_front: a new preference each step) and is evaluated at
the 10 preferences of the simplex's thirds (trainer.front.rays=10); the separate-model front is 10 runs of
`--steps / 10` steps, one per preference (balancer=linear with that preference), so both spend the same steps.
Two processes run at once (one per core): cosmos then pamal; phn then the separate models. The report is
`mtl-bench report DIR --plots DIR/plots` (its fronts table: hypervolume ± 95% CI over seeds).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from mtl_bench.analysis.machine import machine_description

TASKS = ("left", "right", "sum")
FRONTS = {"cosmos": "balancer=cosmos", "phn": "balancer=linear", "pamal": "balancer=linear"}


def thirds() -> list[list[float]]:
    return [[a / 3, b / 3, (3 - a - b) / 3] for a in range(4) for b in range(4 - a)]


def train(args: list[str], log: Path) -> list[str]:
    command = [sys.executable, "-m", "mtl_bench", "train", "-m", *args, "trainer.num_threads=1"]
    return command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--model", default="lenet", help="model= of every run (digits_front's own is mlp)")
    parser.add_argument("--raw-sum", action="store_true", help="train the sum in its own units (its MSE ~16.5)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--collect", action="store_true")
    args = parser.parse_args()
    out: Path = args.out
    if not args.collect:
        out.mkdir(parents=True, exist_ok=True)
        seeds = f"seed={args.seeds}"
        task_keys = [] if args.raw_sum else ["tasks.standardize_sum=true", "tasks.front_reference.sum=1.25"]
        # digits_front is the MLP's setting (widths, lr 3e-3, batch 64); another model trains as digits_lenet does
        # (lr 1e-3, batch 128) with the front's linear scalarization
        base = ["experiment=digits_front"] if args.model == "mlp" else ["experiment=digits_lenet", "balancer=linear"]
        # run directories by job number: the overrides would make names longer than the file system allows
        common = [*base, f"model={args.model}", *task_keys, "hydra.sweep.subdir=${hydra.job.num}"]

        def fronts(name: str) -> list[str]:
            return [
                *common, f"model/front={name}", FRONTS[name], "balancer.preference=dirichlet",
                f"trainer.max_steps={args.steps}", "trainer.front.rays=10", seeds, f"hydra.sweep.dir={out / name}",
            ]  # fmt: skip

        preferences = ",".join("{" + ",".join(f"{t}:{r!r}" for t, r in zip(TASKS, ray)) + "}" for ray in thirds())
        separate = [
            *common, f"balancer.preference={preferences}", f"trainer.max_steps={args.steps // 10}",
            f"trainer.eval_every={args.steps // 10}", seeds, f"hydra.sweep.dir={out / 'separate'}",
        ]  # fmt: skip
        streams = [[fronts("cosmos"), fronts("pamal")], [fronts("phn"), separate]]
        print(machine_description(), flush=True)
        started = time.time()
        procs = []
        for i, stream in enumerate(streams):
            script = " && ".join(
                " ".join(f"'{a}'" for a in train(cmd, out)) + f" >> {out / f'stream{i}.log'} 2>&1" for cmd in stream
            )
            procs.append(subprocess.Popen(["bash", "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"}))
        codes = [p.wait() for p in procs]
        print(f"sweeps done in {time.time() - started:.0f} s, exit codes {codes}; {machine_description()}", flush=True)
    report = subprocess.run(
        [sys.executable, "-m", "mtl_bench", "report", str(out), "--format", "markdown", "--plots", str(out / "plots")],
        capture_output=True,
        text=True,
    )
    print(report.stdout[report.stdout.find("Fronts on") :] if "Fronts on" in report.stdout else report.stdout)
    print(report.stderr[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
