"""NYUv2 loading at speed: samples/s of the loader alone against the samples/s a training step consumes.

    python scripts/bench_loader.py [--root DIR] [--samples 32] [--batch-size 2] [--workers 0 1 2]
                                   [--loader-batches 24] [--steps 4] [--model segnet [segnet_mtan]] [--device cpu]

Generates an NYUv2-format tree (MTAN's `{train,val}/{image,label,depth,normal}/<i>.npy`, 288x384 float32,
--samples training images) in a temporary folder unless --root names a real one, and builds `tasks=nyuv2` on it
(augmentation on, as training runs). Then:

1. the constructor's checks (every file's header) alone;
2. the loader alone: the engine's loader path (`mtl_bench.engine.data.BatchSource`: a DataLoader over the
   engine's step sampler, pinned memory only on CUDA) for --loader-batches batches of --batch-size after one
   warm-up batch, for each --workers count;
3. training steps without loading: forward, the three task losses, backward and an Adam step on batches already
   in memory: the samples/s one training step consumes;
4. the training loop with the loader (each --workers count): samples/s, and the share of the wall time spent
   waiting for the next batch (the loop waits on data when that share is not ~0).

The goal: the loader alone delivers at least 3x the samples/s a training step consumes, for nyuv2
with SegNet (`--model`: options of conf/model/, built from their YAML as the recipe builds them; steps 3 and 4
run for each). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.runs import build_model as build_from_config
from benchmarks.runs import compose
from benchmarks.timing import ratio, seconds_per_call, sync
from mtl_bench.engine.data import BatchSource, StepSampler
from mtl_bench.models import MultiTaskModel
from mtl_bench.tasks import NYUv2


def write_tree(root: Path, n_train: int, n_val: int = 2, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        for kind in ("image", "label", "depth", "normal"):
            (root / split / kind).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            normal = rng.normal(size=(288, 384, 3))
            normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
            arrays = {
                "image": rng.random((288, 384, 3)),
                "label": rng.integers(-1, 13, (288, 384)),
                "depth": rng.uniform(0.5, 8, (288, 384, 1)),
                "normal": normal,
            }
            for kind, array in arrays.items():
                np.save(root / split / kind / f"{i}.npy", array.astype(np.float32))


def build_model(option: str, tasks: NYUv2) -> MultiTaskModel:
    """`model=<option>` built from its YAML as the recipe builds it (input shape and heads from the task set)."""
    return build_from_config(compose([f"model={option}"]), tasks)


def n_items(dataset: Any) -> int:
    return len(dataset)


def loader_alone(tasks: NYUv2, batch: int, workers: int, batches: int, device: torch.device) -> float:
    source = BatchSource(tasks.train, StepSampler(n_items(tasks.train), batch, seed=0), 0, batch, device, workers)
    source.batch(0)  # warm-up: starts the workers
    start = time.perf_counter()
    for step in range(1, batches + 1):
        source.batch(step)
    return batches * batch / (time.perf_counter() - start)


def step_fn(model: MultiTaskModel, tasks: NYUv2, device: torch.device) -> Any:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(inputs: torch.Tensor, targets: dict[str, torch.Tensor]) -> None:
        optimizer.zero_grad(set_to_none=True)
        preds = model(inputs).preds
        loss = sum(t.loss(preds[t.name].float(), targets[t.name]) for t in tasks.tasks)
        loss.backward()  # type: ignore[union-attr]
        optimizer.step()
        sync(device)

    return step


def compute_alone(step: Any, tasks: NYUv2, batch: int, steps: int, device: torch.device) -> float:
    items = [tasks.train[i] for i in range(batch)]
    inputs = torch.stack([x for x, _ in items]).to(device)
    targets = {name: torch.stack([y[name] for _, y in items]).to(device) for name in tasks.task_names}
    step(inputs, targets)  # warm-up
    times = [seconds_per_call(lambda: step(inputs, targets), 1) for _ in range(steps)]
    return batch / statistics.median(times)


def loop_with_loader(
    step: Any, tasks: NYUv2, batch: int, workers: int, steps: int, device: torch.device
) -> tuple[float, float]:
    source = BatchSource(tasks.train, StepSampler(n_items(tasks.train), batch, seed=0), 0, batch, device, workers)
    step(*source.batch(0))  # warm-up: workers started, first step done
    waiting = 0.0
    start = time.perf_counter()
    for k in range(1, steps + 1):
        before = time.perf_counter()
        inputs, targets = source.batch(k)
        waiting += time.perf_counter() - before
        step(inputs, targets)
    wall = time.perf_counter() - start
    return steps * batch / wall, waiting / wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, help="an NYUv2 tree to read (default: generate one)")
    parser.add_argument("--samples", type=int, default=32, help="training images of the generated tree")
    parser.add_argument("--batch-size", type=int, default=2, help="2: the batch of MTAN/CAGrad/Nash-MTL on NYUv2")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--loader-batches", type=int, default=24)
    parser.add_argument("--steps", type=int, default=4, help="timed training steps (after one warm-up step)")
    parser.add_argument("--model", nargs="+", default=["segnet"], help="model options (conf/model/*.yaml)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    load_before = os.getloadavg()[0]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        root = args.root
        if root is None:
            root = Path(scratch) / "nyuv2"
            write_tree(root, args.samples)
        start = time.perf_counter()
        tasks = NYUv2(str(root))
        check_s = time.perf_counter() - start
        n_files = 4 * (n_items(tasks.train) + n_items(tasks.test))
        print(
            f"torch {torch.__version__}, {platform.machine()}, device {device}, {torch.get_num_threads()} intra-op "
            f"threads, {os.cpu_count()} CPUs, load average {load_before:.1f}; batch {args.batch_size}; tasks=nyuv2 "
            f"(augment on), {n_items(tasks.train)} training images at 288x384; constructor checks of {n_files} "
            f"file headers: {1000 * check_s:.0f} ms\n"
        )
        print("| measured | samples/s | note |\n|---|---:|---|", flush=True)

        def row(*cells: str) -> None:  # one line at a time: a long run shows its progress
            print("| " + " | ".join(cells) + " |", flush=True)

        loader = {w: loader_alone(tasks, args.batch_size, w, args.loader_batches, device) for w in args.workers}
        for w, rate in loader.items():
            row(f"loader alone (augmented), {w} workers", f"{rate:.1f}", "")
        best = max(loader.values())
        for option in args.model:
            torch.manual_seed(0)
            model = build_model(option, tasks).to(device).train()
            step = step_fn(model, tasks, device)
            consumed = compute_alone(step, tasks, args.batch_size, args.steps, device)
            row(f"model={option}: training step alone, batches in memory", f"{consumed:.3f}", "")
            for w in args.workers:
                rate, waiting = loop_with_loader(step, tasks, args.batch_size, w, args.steps, device)
                row(
                    f"model={option}: training loop with the loader, {w} workers",
                    f"{rate:.3f}",
                    f"{100 * waiting:.1f}% of the wall time waiting for data",
                )
            row(
                f"model={option}: best loader alone / training step",
                ratio(best, consumed),
                "goal >= 3x: " + ("met" if best >= 3 * consumed else "NOT met"),
            )
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
