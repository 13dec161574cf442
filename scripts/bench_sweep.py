"""Wall time of a 4-job sweep: Hydra's basic launcher (one job after another) against the joblib launcher.

    python scripts/bench_sweep.py [--steps 500] [--n-jobs 2]

Needs the sweep extra (pip install -e ".[sweep]"). Both sweeps train the default experiment with seeds
0-3 from a scratch directory; the joblib jobs get cores / n_jobs torch threads each (mtl-bench sets it).
Prints a markdown table with the ratio to the basic launcher measured in the same run.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile

from benchmarks.timing import markdown_table, ratio, timed_command
from mtl_bench.analysis.machine import machine_description


def sweep(extra: list[str], steps: int, cwd: str) -> float:
    return timed_command(
        [
            sys.executable,
            "-m",
            "mtl_bench",
            "train",
            "-m",
            "seed=0,1,2,3",
            f"trainer.max_steps={steps}",
            "trainer.progress=log",
            *extra,
        ],
        cwd,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--n-jobs", type=int, default=2)
    args = parser.parse_args()
    cases = [
        ("basic (sequential, torch's default threads)", []),
        (f"joblib, n_jobs={args.n_jobs}", ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.n_jobs}"]),
    ]
    with tempfile.TemporaryDirectory() as cwd:
        rows = [(name, sweep(extra, args.steps, cwd)) for name, extra in cases]
    print(f"machine: {machine_description()}, Python {platform.python_version()}; 4 jobs x {args.steps} steps")
    cells = [[name, f"{seconds:.1f}", ratio(seconds, rows[0][1])] for name, seconds in rows]
    print(markdown_table(["launcher", "wall s", "ratio to basic"], cells))


if __name__ == "__main__":
    main()
