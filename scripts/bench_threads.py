"""Intra-op threads: `trainer.num_threads=auto` against torch's default, and where a second thread pays.

    python scripts/bench_threads.py [--repeats 2] [--max-steps 1000] [--copies 1 2 4]
    python scripts/bench_threads.py --sizes [--repeats 5] [--steps 40]
    python scripts/bench_threads.py --auto [--loads 0 2 4] [--repeats 9] [--steps 10]
    python scripts/bench_threads.py --table-from STDERR_LOG --max-steps N   (the table again from a run's log)

Default mode: starts 1, 2 and 4 copies at once of `mtl-bench train` (the default experiment) and of
`mtl-bench train experiment=gradnorm_toy`, both with trainer.max_steps=--max-steps, once with the threads
`auto` chooses and once with torch's default (trainer.num_threads=null), and prints each copy's wall time
(process start to exit, median over the copies and the repeats) in one markdown table. Settings alternate
within each repeat so that load from elsewhere hits both alike.

--sizes: the threshold behind auto's small-model rule. For models of growing size (the MLP's width, LeNet's
channels), one process times training steps of the real recipe (model, balancer, Adam) with 1 thread and
with every core, alternating blocks of --steps steps, and prints the median step time of each and their
ratio, for the median block and for the best one (the least disturbed by other processes). A model whose
step is no faster with all cores even in its best block is "small".

--auto: whether `auto` is ever slower than one thread, or than torch's default. For models above the small-model
threshold (MMoE with UPGrad and with fixed weights, a 4x400 MLP with UPGrad), at each of --loads (that many busy
processes started by this script, each spinning one core, stopped after), one process times blocks of --steps
real steps with 1 thread, with torch's default (one thread per core), and with what `choose_threads("auto", ...)`
chooses just before the block (as a run starting then would: it watches the cores for 0.25 s, untimed),
interleaved; prints the median ms of each, what auto chose, the load average, and the median over the rounds of
each round's auto / 1 thread and auto / default (interleaved pairs: load that drifts hits both alike). Run it on a
machine with nothing else running: the loads are the script's own.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

EXPERIMENTS = {"default": [], "gradnorm_toy": ["experiment=gradnorm_toy"]}

# --sizes: (label, overrides) from small to large
SIZES = [
    ("mlp 4x100, 2 tasks (default)", []),
    ("mlp 4x100, 10 tasks, gradnorm (gradnorm_toy)", ["experiment=gradnorm_toy"]),
    ("mlp 4x200, 2 tasks", ["model.widths=[200,200,200,200]"]),
    ("mlp 4x400, 2 tasks", ["model.widths=[400,400,400,400]"]),
    ("mlp 4x800, 2 tasks", ["model.widths=[800,800,800,800]"]),
    ("mlp 4x1600, 2 tasks", ["model.widths=[1600,1600,1600,1600]"]),
    ("lenet [10,20] h50, digits (digits_lenet)", ["experiment=digits_lenet"]),
    ("lenet [32,64] h256, digits", ["experiment=digits_lenet", "model.channels=[32,64]", "model.hidden=256"]),
    ("lenet [64,128] h512, digits", ["experiment=digits_lenet", "model.channels=[64,128]", "model.hidden=512"]),
]


# --auto: models above SMALL_MODEL_NUMEL, the cases first
AUTO_CASES = [
    ("mmoe, upgrad", ["model/arch=mmoe", "balancer=upgrad"]),
    ("mmoe, fixed", ["model/arch=mmoe"]),
    ("mlp 4x400, upgrad", ["model.widths=[400,400,400,400]", "balancer=upgrad"]),
]


def model_numel(overrides: list[str]) -> int:
    """Parameters of the experiment's model, built from its config as the recipe builds it."""
    from benchmarks.runs import build_model, build_taskset, compose

    cfg = compose(overrides)
    return sum(p.numel() for p in build_model(cfg, build_taskset(cfg)).parameters())


# ----------------------------------------------------------------------------- copies at once


def run_copies(cli_args: list[str], copies: int, workdir: Path) -> list[tuple[float, float]]:
    """Start `copies` runs at once; each one's (wall time, start to exit; CPU time, user + system)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    pending = {}
    for i in range(copies):
        run_dir = tempfile.mkdtemp(prefix=f"copy{i}-", dir=workdir)
        cmd = [
            sys.executable,
            "-m",
            "mtl_bench",
            "train",
            *cli_args,
            "trainer.progress=log",
            f"hydra.run.dir={run_dir}",
        ]
        err = open(Path(run_dir).with_suffix(".err"), "w+")
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=err)
        pending[proc.pid] = (time.perf_counter(), proc, err)
    results = []
    while pending:
        pid, status, usage = os.wait4(-1, 0)  # whichever copy ends first, timed when it ends
        if pid not in pending:
            continue
        started, proc, err = pending.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        results.append((time.perf_counter() - started, usage.ru_utime + usage.ru_stime))
        with err:
            if proc.returncode != 0:
                err.seek(0)
                raise SystemExit(f"run failed ({' '.join(cli_args)}):\n{err.read()[-2000:]}")
    return results


def copies_table(args: argparse.Namespace) -> None:
    from mtl_bench.engine.threads import choose_threads

    auto_value: dict[str, str] = {}
    for name, overrides in EXPERIMENTS.items():
        _, reason = choose_threads("auto", model_numel=model_numel(overrides), parallel_runs=1)
        auto_value[name] = "auto"
        print(f"{name}: auto -> {reason}", file=sys.stderr)
    settings = {"auto": auto_value, "torch default": {name: "null" for name in EXPERIMENTS}}
    times: dict[tuple[str, int, str], list[float]] = {}
    cpu: dict[tuple[str, int, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, overrides in EXPERIMENTS.items():
                for copies in args.copies:
                    order = list(settings) if rep % 2 == 0 else list(reversed(settings))
                    for setting in order:
                        cli_args = [
                            *overrides,
                            f"trainer.max_steps={args.max_steps}",
                            f"trainer.num_threads={settings[setting][name]}",
                        ]
                        results = run_copies(cli_args, copies, Path(tmp))
                        times.setdefault((name, copies, setting), []).extend(w for w, _ in results)
                        cpu.setdefault((name, copies, setting), []).extend(c for _, c in results)
                        print(
                            f"repeat {rep}: {name} x{copies} {setting}: "
                            + " ".join(f"{w:.1f}" for w, _ in results)
                            + " | cpu "
                            + " ".join(f"{c:.1f}" for _, c in results),
                            file=sys.stderr,
                        )
    print_copies_table(times, cpu, auto_value, args.max_steps, args.repeats, args.copies)


def print_copies_table(
    times: dict[tuple[str, int, str], list[float]],
    cpu: dict[tuple[str, int, str], list[float]],
    auto_value: dict[str, str],
    max_steps: int,
    repeats: int,
    copies_list: list[int],
) -> None:
    from benchmarks.timing import markdown_table, ratio
    from mtl_bench.analysis.machine import machine_description
    from mtl_bench.engine.threads import available_cores

    print(
        f"machine: {machine_description()}, Python {platform.python_version()}; "
        f"{available_cores()} cores in this process's affinity"
    )
    print(
        f"trainer.max_steps={max_steps}; wall time of each copy, process start to exit, median over "
        f"the copies and {repeats} repeat(s), and its CPU time (user + system); auto = trainer.num_threads="
        + ", ".join(f"{v} ({k})" for k, v in auto_value.items())
        + "\n"
    )
    header = ["experiment", "copies", "auto s", "default s", "default/auto", "auto/1 copy", "default/1 copy"]
    header += ["auto CPU s", "default CPU s"]  # per copy; default: torch's own thread count
    cells = []
    for name in EXPERIMENTS:
        alone = {
            setting: statistics.median(times[(name, copies_list[0], setting)]) for setting in ("auto", "torch default")
        }
        for copies in copies_list:
            auto = statistics.median(times[(name, copies, "auto")])
            default = statistics.median(times[(name, copies, "torch default")])
            cpu_cells = [
                f"{statistics.median(cpu[(name, copies, s)]):.1f}" if cpu.get((name, copies, s)) else ""
                for s in ("auto", "torch default")
            ]
            cells.append(
                [name, copies, f"{auto:.1f}", f"{default:.1f}", ratio(default, auto), ratio(auto, alone["auto"])]
                + [ratio(default, alone["torch default"]), *cpu_cells]
            )
    print(markdown_table(header, cells))


def table_from_log(path: str, max_steps: int) -> None:
    """The table again from the progress lines a run wrote to stderr (e.g. a run stopped after its first repeat)."""
    times: dict[tuple[str, int, str], list[float]] = {}
    cpu: dict[tuple[str, int, str], list[float]] = {}
    auto_value: dict[str, str] = {}
    repeats: set[str] = set()
    for line in Path(path).read_text().splitlines():
        auto = re.match(r"(\S+): auto -> (\d+) ", line)
        run = re.match(r"repeat (\d+): (\S+) x(\d+) (.+?): ([\d. ]+?)(?: \| cpu ([\d. ]+))?$", line)
        if auto:
            auto_value[auto.group(1)] = auto.group(2)
        elif run:
            rep, name, count, setting, walls, cpus = run.groups()
            times.setdefault((name, int(count), setting), []).extend(float(w) for w in walls.split())
            if cpus:
                cpu.setdefault((name, int(count), setting), []).extend(float(c) for c in cpus.split())
            repeats.add(rep)
    copies_list = sorted({c for (_, c, _) in times})
    complete = [
        c for c in copies_list if all((n, c, s) in times for n in EXPERIMENTS for s in ("auto", "torch default"))
    ]
    print_copies_table(times, cpu, auto_value, max_steps, len(repeats), complete)


# ----------------------------------------------------------------------------- the size threshold


def time_steps(recipe: Any, steps: int) -> float:
    """Seconds per optimizer step over `steps` steps of the recipe's real step."""
    from benchmarks.runs import recipe_step
    from benchmarks.timing import seconds_per_call

    return seconds_per_call(lambda: recipe_step(recipe), steps)


def sizes_table(args: argparse.Namespace) -> None:
    import torch

    from benchmarks.runs import recipe as set_up
    from benchmarks.timing import interleaved, markdown_table, medians, ratio
    from mtl_bench.analysis.machine import machine_description
    from mtl_bench.engine.threads import available_cores

    cores = available_cores()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, overrides in SIZES:
            if args.match and not any(m in label for m in args.match):
                continue
            run_overrides = [*overrides, "trainer.max_steps=100000", "trainer.progress=log"]
            with set_up(run_overrides, Path(tmp) / label.replace(" ", "_")) as recipe:
                numel = sum(p.numel() for p in recipe.model.parameters())
                recipe.model.train()
                for threads in (cores, 1):  # warm-up: allocator, first-call costs
                    torch.set_num_threads(threads)
                    time_steps(recipe, max(3, args.steps // 4))

                def timer(threads: int) -> Callable[[], float]:
                    def timed() -> float:
                        torch.set_num_threads(threads)
                        return time_steps(recipe, args.steps)

                    return timed

                per = interleaved({1: timer(1), cores: timer(cores)}, args.repeats)
            one, many = medians(per)[1], medians(per)[cores]
            rows.append((label, numel, one, many, min(per[1]), min(per[cores])))
            print(
                f"{label}: {numel} parameters, {one * 1e3:.2f} ms (1 thread), {many * 1e3:.2f} ms ({cores})",
                file=sys.stderr,
            )
    print(f"machine: {machine_description()}, Python {platform.python_version()}")
    print(
        f"ms per optimizer step (forward, balancer backward, Adam) over {args.repeats} blocks of {args.steps} "
        "steps, thread counts alternating in one process: the median block, and the best block (the least "
        "disturbed by other processes: the nearest to a quiet machine)\n"
    )
    header = ["model", "parameters", "1 thread ms", f"{cores} threads ms", f"{cores} / 1", "best 1 thread ms"]
    header += [f"best {cores} threads ms", f"best {cores} / best 1"]
    cells = [
        [label, f"{numel:,}", f"{one * 1e3:.2f}", f"{many * 1e3:.2f}", ratio(many, one), f"{best_one * 1e3:.2f}"]
        + [f"{best_many * 1e3:.2f}", ratio(best_many, best_one)]
        for label, numel, one, many, best_one, best_many in rows
    ]
    print(markdown_table(header, cells))


def busy_processes(n: int) -> list[subprocess.Popen]:
    """`n` processes that each keep one core busy until they are stopped (`stop`)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL) for _ in range(n)]


def stop(processes: list[subprocess.Popen]) -> None:
    for proc in processes:
        proc.terminate()
    for proc in processes:
        proc.wait()


def pair_ratio(values: list[float], bases: list[float]) -> str:
    """The median over the rounds of each round's value / base, as a table cell."""
    return f"{statistics.median(v / b for v, b in zip(values, bases)):.2f}x"


def auto_table(args: argparse.Namespace) -> None:
    import collections

    import torch

    default_threads = torch.get_num_threads()  # torch's default, before anything here sets it

    from benchmarks.runs import recipe as set_up
    from benchmarks.timing import interleaved, markdown_table, medians
    from mtl_bench.analysis.machine import machine_description
    from mtl_bench.engine.threads import choose_threads

    start_load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, overrides in AUTO_CASES:
            run_overrides = [*overrides, "trainer.max_steps=100000", "trainer.progress=log", "trainer.num_threads=1"]
            with set_up(run_overrides, Path(tmp) / label.replace(" ", "_").replace(",", "")) as recipe:
                numel = sum(p.numel() for p in recipe.model.parameters())
                recipe.model.train()
                for threads in (default_threads, 1):  # warm-up: allocator, first-call costs
                    torch.set_num_threads(threads)
                    time_steps(recipe, max(2, args.steps // 4))
                for busy in args.loads:
                    chosen: collections.Counter[int] = collections.Counter()

                    def timer(threads: int | None) -> Callable[[], float]:
                        def timed() -> float:
                            n = threads
                            if n is None:  # auto, as a run starting now: it watches the cores first (untimed)
                                n = choose_threads("auto", model_numel=numel)[0]
                                chosen[n] += 1
                            torch.set_num_threads(n)
                            return time_steps(recipe, args.steps)

                        return timed

                    spinning = busy_processes(busy)
                    try:
                        time.sleep(1.0 if busy else 0.0)  # the spinners running before the first block
                        variants = {"1": timer(1), "default": timer(default_threads), "auto": timer(None)}
                        per = interleaved(variants, args.repeats)
                        load = os.getloadavg()[0]
                    finally:
                        stop(spinning)
                    mid = medians(per)
                    picks = ", ".join(f"{n} x{c}" for n, c in sorted(chosen.items()))
                    rows.append(
                        [label, f"{numel:,}", busy, f"{load:.1f}", f"{mid['1'] * 1e3:.1f}"]
                        + [f"{mid['default'] * 1e3:.1f}", f"{mid['auto'] * 1e3:.1f}", picks]
                        + [pair_ratio(per["auto"], per["1"]), pair_ratio(per["auto"], per["default"])]
                    )
                    print(f"{label}: {rows[-1]}", file=sys.stderr)
    print(f"machine: {machine_description()}, Python {platform.python_version()}")
    print(f"load average (1 min) at the start: {start_load:.1f}; torch's default: {default_threads} threads")
    print(
        f"ms per optimizer step, median of {args.repeats} interleaved blocks of {args.steps} steps, beside 'busy' "
        f"processes each spinning a core (started by this script); 1 thread, torch's default ({default_threads}), "
        "and auto (chosen before each block; 'n xk': n threads in k blocks); the ratios are medians over the rounds "
        "of each round's pair\n"
    )
    header = ["model", "parameters", "busy", "load", "1 thread ms", "default ms", "auto ms", "auto chose"]
    header += ["auto / 1", "auto / default"]
    print(markdown_table(header, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", action="store_true", help="time 1 thread against all cores by model size")
    parser.add_argument("--auto", action="store_true", help="time auto's choice against 1 thread, big models")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="--sizes (40), --auto (10): steps per timed block")
    parser.add_argument("--match", nargs="+", help="--sizes: only the models whose label contains one of these")
    parser.add_argument("--max-steps", type=int, default=1000, help="trainer.max_steps of each run")
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 2, 4], help="--auto: busy processes beside it")
    parser.add_argument("--table-from", metavar="STDERR_LOG", help="print the table from an earlier run's stderr")
    args = parser.parse_args()
    if args.table_from:
        table_from_log(args.table_from, args.max_steps)
    elif args.sizes:
        args.repeats, args.steps = args.repeats or 5, args.steps or 40
        sizes_table(args)
    elif args.auto:
        args.repeats, args.steps = args.repeats or 9, args.steps or 10
        auto_table(args)
    else:
        args.repeats = args.repeats or 2
        copies_table(args)


if __name__ == "__main__":
    main()
