"""Training-step throughput of fp32, bf16 and fp16 on the default models, measured in one run.

    python scripts/bench_precision.py [--steps 200] [--threads 2] [--device auto]

For each experiment (toy + mlp, the default; digits + lenet) it times the engine's own optimizer step
(`Recipe.optimizer_step`: forwards, balancer backward, non-finite checks, grad scaler for fp16, optimizer)
and prints steps/s with the ratio to fp32 in the same run. A first row per experiment, "fp32, bare loop", is
a hand-written step without the engine's non-finite checks: it shows what they cost.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.runs import recipe, recipe_step
from benchmarks.timing import markdown_table, ratio, seconds_per_call
from mtl_bench.analysis.machine import machine_description
from mtl_bench.engine.builders import pick_device

EXPERIMENTS = {"toy + mlp (default)": [], "digits + lenet": ["experiment=digits_lenet"]}


def overrides_for(overrides: list[str], device: torch.device) -> list[str]:
    """Seed 0, and a schedule spanning 10**6 steps, so the lr stays where it starts over the timed steps."""
    return [*overrides, "seed=0", "trainer.max_steps=1000000", "trainer.epochs=null", f"trainer.device={device}"]


def time_recipe(run: Any, steps: int, device: torch.device) -> float:
    """The engine's own step: forwards, balancer backward, non-finite checks, grad scaler, optimizer."""
    seconds_per_call(lambda: recipe_step(run), 10)  # warm-up: allocator, autocast caches
    return 1 / seconds_per_call(lambda: recipe_step(run), steps, device)


def time_plain(run: Any, steps: int, device: torch.device) -> float:
    """The step without the engine's checks: zero_grad, forward, balancer backward, optimizer step."""
    source, optimizer, model, balancer = run.runner.sources[0], run.optimizer, run.model, run.balancer
    tasks = run.taskset.tasks
    count = iter(range(10**9))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        inputs, targets = source.batch(next(count))
        out = model(inputs)
        balancer.backward({t.name: t.loss(out.preds[t.name], targets[t.name]) for t in tasks}, out.shared)
        optimizer.step()

    seconds_per_call(step, 10)
    return 1 / seconds_per_call(step, steps, device)


def timed(overrides: list[str], device: torch.device, run_dir: Path, steps: int, plain: bool = False) -> float:
    with recipe(overrides_for(overrides, device), run_dir) as run:
        return (time_plain if plain else time_recipe)(run, steps, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)

    print(
        f"machine: {machine_description()}, Python {platform.python_version()}, device {device}, "
        f"{args.steps} timed steps each"
    )
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in EXPERIMENTS.items():
            plain = timed(overrides, device, Path(tmp) / "plain", args.steps, plain=True)
            rows = [("fp32, bare loop", plain)]
            for precision in ("fp32", "bf16", "fp16"):
                run_dir = Path(tmp) / precision
                rows.append((precision, timed([*overrides, f"precision={precision}"], device, run_dir, args.steps)))
            base = rows[1][1]
            cells += [[name, label, f"{rate:.0f}", ratio(rate, base)] for label, rate in rows]
    print(markdown_table(["experiment", "precision", "steps/s", "ratio to fp32"], cells))


if __name__ == "__main__":
    main()
