"""Training steps per second with the model's forward compiled (trainer.compile) against eager.

    python scripts/bench_compile.py [--repeats 7] [--steps 30] [--threads 1] [--modes default ...] [--warm-cache]

For the default experiment and experiment=digits_lenet, one process builds the run as `mtl-bench train`
does (Recipe.setup: model, balancer, Adam; on CUDA when there is one) and times the recipe's real optimizer
step with the forward model eager, and with `maybe_compile(model, mode)` for each mode. The first compiled
step (compilation of the forward and backward graphs) is timed on its own, with inductor's on-disk cache
empty unless --warm-cache. Afterwards blocks of --steps steps alternate between eager and compiled, and the
table gives the median steps/s of each. A reference row compiles the whole model with torch.compile(model)
(no cut at the shared representation: right for balancers that differentiate only the total loss, such
as the default fixed weights, wrong for the others; see mtl_bench/engine/compile.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EXPERIMENTS = {"default": [], "digits_lenet": ["experiment=digits_lenet"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=30, help="steps per timed block")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (auto gives these models 1)")
    parser.add_argument("--modes", nargs="+", default=["default"])
    parser.add_argument("--no-whole", action="store_true", help="skip the torch.compile(model) reference row")
    parser.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk cache (first step faster)")
    args = parser.parse_args()
    cache = None if args.warm_cache else tempfile.TemporaryDirectory(prefix="inductor-cache-")
    if cache is not None:  # read by inductor at import: before torch
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name

    import torch

    from benchmarks.runs import recipe as set_up
    from benchmarks.runs import recipe_step
    from benchmarks.timing import interleaved, markdown_table, medians, ratio, seconds_per_call, sync
    from mtl_bench.analysis.machine import machine_description
    from mtl_bench.engine.compile import maybe_compile

    torch.set_num_threads(args.threads)

    def step(recipe: Any) -> None:
        recipe_step(recipe)
        sync(recipe.device)

    def block(recipe: Any, forward: Any) -> float:
        recipe.runner.model = forward
        return 1 / seconds_per_call(lambda: recipe_step(recipe), args.steps, recipe.device)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in EXPERIMENTS.items():
            run_overrides = [*overrides, "trainer.max_steps=1000000", "trainer.progress=log"]
            with set_up(run_overrides, Path(tmp) / name) as recipe:
                torch.set_num_threads(args.threads)
                model = recipe.model
                model.train()
                variants: dict[str, Any] = {"eager": model}
                for mode in args.modes:
                    variants[f"trainer.compile={mode}"] = maybe_compile(model, mode)
                if not args.no_whole:
                    variants["torch.compile(model), whole (reference)"] = torch.compile(model)
                first = {}
                for label, forward in variants.items():
                    recipe.runner.model = forward
                    start = time.perf_counter()
                    step(recipe)
                    first[label] = time.perf_counter() - start
                    for _ in range(3):
                        step(recipe)
                    print(f"{name} {label}: first step {first[label]:.2f} s", file=sys.stderr)
                timers = {label: (lambda f=forward: block(recipe, f)) for label, forward in variants.items()}
                rates = medians(interleaved(timers, args.repeats))
                for label in variants:
                    rows.append([name, label, f"{first[label]:.2f}", f"{rates[label]:.1f}"])
                    rows[-1].append(ratio(rates[label], rates["eager"]))
                device = recipe.device
    print(
        f"machine: {machine_description()}, Python {platform.python_version()}; device {device}, "
        f"{args.threads} intra-op thread(s); inductor cache {'warm' if args.warm_cache else 'empty at start'}"
    )
    print(
        f"steps/s: median of {args.repeats} blocks of {args.steps} optimizer steps, variants alternating in one "
        "process; first step: the first optimizer step of each variant (compilation included)\n"
    )
    print(markdown_table(["experiment", "forward", "first step s", "steps/s", "vs eager"], rows))
    if cache is not None:
        cache.cleanup()


if __name__ == "__main__":
    main()
