"""Training-step time of the bilevel balancers (auto_lambda, moml, forum) against fixed weights, measured in one run.

    python scripts/bench_bilevel.py [--rounds 7] [--steps 20] [--threads 1]

For each experiment one process builds runs as `mtl-bench train` does (Recipe.setup), one with balancer=fixed
and one per bilevel balancer (its validation stream held out of the training split), and
times the recipe's real optimizer step of each in blocks of --steps steps, interleaved round after round; the
table gives the median ms/step and its ratio to fixed weights of the same run. Auto-λ's step adds a backward
(the look-ahead gradient), a forward and backward at the look-ahead parameters on the validation batch and two
forwards at θ ± εd; MOML's 2T backwards (each task's gradient on the training batch and, at the look-ahead
parameters, on the validation batch) and one forward; FORUM's a backward (g_f), inner_step forwards and backwards
and a forward at the inner copies, a forward and T backwards on the validation batch and a small program on the
host (docs/bilevel.md).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.runs import recipe, recipe_step
from benchmarks.timing import interleaved, markdown_table, medians, ratio, seconds_per_call
from mtl_bench.analysis.machine import machine_description

EXPERIMENTS = {
    "toy (MLP, T=2, batch 128)": [],
    "toy10 (MLP, T=10, batch 128)": ["tasks=toy10"],
    "digits_lenet (LeNet, T=3)": ["experiment=digits_lenet"],
}
BALANCERS = ("fixed", "auto_lambda", "moml", "forum")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        for experiment, overrides in EXPERIMENTS.items():
            runs: dict[str, Any] = {}
            for balancer in BALANCERS:
                run_overrides = [
                    *overrides,
                    f"balancer={balancer}",
                    "trainer.max_steps=1000000",
                    "trainer.progress=log",
                ]
                runs[balancer] = stack.enter_context(recipe(run_overrides, Path(tmp) / f"{experiment[:5]}-{balancer}"))
            torch.set_num_threads(args.threads)
            for run in runs.values():  # warm-up
                run.model.train()
                for _ in range(3):
                    recipe_step(run)

            def block(run: Any) -> float:
                return seconds_per_call(lambda: recipe_step(run), args.steps, run.device)

            results = medians(interleaved({b: (lambda r=runs[b]: block(r)) for b in BALANCERS}, args.rounds))
            for balancer in BALANCERS:
                ms = 1000 * results[balancer]
                rows.append([experiment, balancer, f"{ms:.2f}", ratio(results[balancer], results["fixed"])])
    print(f"{machine_description()}; median of {args.rounds} rounds of {args.steps} steps")
    print()
    print(markdown_table(["experiment", "balancer", "ms/step", "x fixed"], rows))


if __name__ == "__main__":
    main()
