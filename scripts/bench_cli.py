"""Start-up and end-to-end times of the CLI, measured in one run.

    python scripts/bench_cli.py [--repeats 5] [--skip-train]

Prints a markdown table: `mtl-bench --help`, `mtl-bench train --help`, `mtl-bench train --cfg job`,
and the default `mtl-bench train` (start-up included), each as the median of several runs, with the
ratio to a bare `python -c pass` measured in the same run (the interpreter's own start-up).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from mtl_bench.analysis.machine import machine_description


def timed(cmd: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-repeats", type=int, default=2)
    parser.add_argument("--skip-train", action="store_true")
    args = parser.parse_args()

    cli = [sys.executable, "-m", "mtl_bench"]
    cases = [
        ("python -c pass (baseline)", [sys.executable, "-c", "pass"], args.repeats),
        ("mtl-bench --help", [*cli, "--help"], args.repeats),
        ("mtl-bench train --help", [*cli, "train", "--help"], args.repeats),
        ("mtl-bench train --cfg job", [*cli, "train", "--cfg", "job"], args.repeats),
    ]
    if not args.skip_train:
        cases.append(("mtl-bench train (default experiment)", [*cli, "train"], args.train_repeats))

    with tempfile.TemporaryDirectory() as cwd:  # run dirs land in a scratch outputs/
        rows = [(name, statistics.median(timed(cmd, cwd) for _ in range(n)), n) for name, cmd, n in cases]
    base = rows[0][1]
    print(f"machine: {machine_description()}, Python {platform.python_version()}")
    print("| command | median s | runs | ratio to python start-up |")
    print("|---|---:|---:|---:|")
    for name, seconds, n in rows:
        print(f"| {name} | {seconds:.2f} | {n} | {seconds / base:.1f}x |")


if __name__ == "__main__":
    main()
