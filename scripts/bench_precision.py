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
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from mtl_bench.analysis.machine import machine_description
from mtl_bench.catalog import conf_root
from mtl_bench.engine.builders import pick_device
from mtl_bench.engine.recipe import Recipe

EXPERIMENTS = {"toy + mlp (default)": [], "digits + lenet": ["experiment=digits_lenet"]}


def make_recipe(overrides: list[str], device: torch.device, run_dir: Path) -> Recipe:
    """The engine's own run, set up (parts built from config, seed 0) but not trained; the schedule spans
    10**6 steps, so the lr stays where it starts over the timed steps."""
    with initialize_config_dir(str(conf_root()), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *overrides,
                "seed=0",
                "trainer.max_steps=1000000",
                "trainer.epochs=null",
                f"trainer.device={device}",
            ],
        )
    recipe = Recipe(cfg, run_dir)
    recipe.setup()
    return recipe


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_recipe(recipe: Recipe, steps: int, device: torch.device) -> float:
    for _ in range(10):  # warm-up: allocator, autocast caches
        recipe.optimizer_step(False)
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        recipe.optimizer_step(False)
        recipe.step += 1
    sync(device)
    return steps / (time.perf_counter() - start)


def time_plain(recipe: Recipe, steps: int, device: torch.device) -> float:
    """The step without the engine's checks: zero_grad, forward, balancer backward, optimizer step."""
    source, optimizer, model, balancer = recipe.runner.sources[0], recipe.optimizer, recipe.model, recipe.balancer
    tasks = recipe.taskset.tasks

    def step(i: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        inputs, targets = source.batch(i)
        out = model(inputs)
        balancer.backward({t.name: t.loss(out.preds[t.name], targets[t.name]) for t in tasks}, out.shared)
        optimizer.step()

    for i in range(10):
        step(i)
    sync(device)
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    sync(device)
    return steps / (time.perf_counter() - start)


def timed(overrides: list[str], device: torch.device, run_dir: Path, steps: int, plain: bool = False) -> float:
    recipe = make_recipe(overrides, device, run_dir)
    try:
        return (time_plain if plain else time_recipe)(recipe, steps, device)
    finally:
        recipe.cleanup()


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
    print("| experiment | precision | steps/s | ratio to fp32 |")
    print("|---|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in EXPERIMENTS.items():
            plain = timed(overrides, device, Path(tmp) / "plain", args.steps, plain=True)
            rows = [("fp32, bare loop", plain)]
            for precision in ("fp32", "bf16", "fp16"):
                run_dir = Path(tmp) / precision
                rows.append((precision, timed([*overrides, f"precision={precision}"], device, run_dir, args.steps)))
            base = rows[1][1]
            for label, rate in rows:
                print(f"| {name} | {label} | {rate:.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
