"""Start-up and end-to-end times of the CLI, measured in one run.

    python scripts/bench_cli.py [--repeats 5] [--skip-train] [--before GIT_REF]

Prints a markdown table: `mtl-bench --help`, `mtl-bench train --help`, `mtl-bench train --cfg job`,
and the default `mtl-bench train` (start-up included), each as the median of several runs, with the
ratio to a bare `python -c pass` measured in the same run (the interpreter's own start-up).
`--before REF` also times the default run of the code at git REF (a temporary worktree on PYTHONPATH),
alternating with today's runs so that load on the machine hits both alike.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile

from benchmarks.timing import markdown_table, ratio, timed_command
from mtl_bench.analysis.machine import machine_description


def before_and_after(ref: str, repeats: int, cwd: str) -> list[tuple[str, float, int]]:
    """Median wall time of the default train at `ref` and now, runs alternating."""
    tree = tempfile.mkdtemp(prefix="mtl-bench-before-")
    subprocess.run(["git", "worktree", "add", "--detach", tree, ref], check=True, capture_output=True)
    try:
        cmd = [sys.executable, "-m", "mtl_bench", "train"]
        before, after = [], []
        for _ in range(repeats):
            before.append(timed_command(cmd, cwd, {"PYTHONPATH": tree}))
            after.append(timed_command(cmd, cwd))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", tree], check=True, capture_output=True)
    return [
        (f"mtl-bench train (default) at {ref}", statistics.median(before), repeats),
        ("mtl-bench train (default) now", statistics.median(after), repeats),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-repeats", type=int, default=2)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--before", metavar="GIT_REF", help="also time the default run of this git ref")
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
        rows = [(name, statistics.median(timed_command(cmd, cwd) for _ in range(n)), n) for name, cmd, n in cases]
        if args.before:
            rows += before_and_after(args.before, args.train_repeats, cwd)
    base = rows[0][1]
    print(f"machine: {machine_description()}, Python {platform.python_version()}")
    header = ["command", "median s", "runs", "ratio to python start-up"]
    print(markdown_table(header, [[name, f"{seconds:.2f}", n, ratio(seconds, base)] for name, seconds, n in rows]))


if __name__ == "__main__":
    main()
