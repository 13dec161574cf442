"""Optimizer step() time on a transformer-shaped parameter set: ScaledAdam against torch's Adam.

    python scripts/bench_optim.py                         # 12 layers, d=512: about 38M parameters
    python scripts/bench_optim.py --layers 2 --rounds 5   # quick run
    python scripts/bench_optim.py --threads 1             # steadier numbers on a shared machine

Every variant owns its own copy of the parameters and gradients. Steps are timed in interleaved rounds
(one step of each variant per round) so load from other processes hits all variants alike; the table gives
the median and the minimum over rounds, the ratio of medians to fused Adam, and the time of the first step.
"ScaledAdam C++ kernel" is `kernel=True` (what `kernel="auto"` picks for a model this size): float32 CPU
tensors through ScaledAdam's kernel, built by torch.utils.cpp_extension when the optimizer is constructed
(outside the timed steps; a minute once per machine, then cached). A second table splits a kernel step
(further interleaved rounds with fused Adam): the statistics pass (sum g^2 per tensor, and sum p*g, sum p^2
where needed), the update pass, and the rest (the host read of the gradient norm, the clipping factor).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from mtl_bench.analysis.machine import machine_description
from mtl_bench.optim import ScaledAdam


def transformer_params(layers: int, d: int, scalars: int, seed: int = 0) -> list[torch.nn.Parameter]:
    """Per layer: four d x d and two d x 4d matrices with biases, two norm weights and biases."""
    g = torch.Generator().manual_seed(seed)
    shapes: list[tuple[int, ...]] = []
    for _ in range(layers):
        shapes += [(d, d), (d,)] * 4 + [(4 * d, d), (4 * d,), (d, 4 * d), (d,)] + [(d,), (d,)] * 2
    shapes += [()] * scalars
    params = [torch.nn.Parameter(torch.randn(s, generator=g) * (0.05 if len(s) == 2 else 1.0)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    return params


def copy_params(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    out = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(out, params):
        p.grad = q.grad.clone()
    return out


def scaled_adam(params: list[torch.nn.Parameter], kernel: bool, stack_max_numel: int | None) -> ScaledAdam:
    opt = ScaledAdam(params, lr=0.02, clipping_scale=2.0, kernel=kernel)
    if stack_max_numel is not None:
        opt.stack_max_numel = stack_max_numel
    return opt


def pass_times(opt: ScaledAdam) -> tuple[float, float, float]:
    """One step of `opt` under torch's profiler: (step, statistics pass, update pass) wall seconds, the passes read
    from ScaledAdam's record_function labels."""
    t = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    total = time.perf_counter() - t
    spent = {e.key: e.cpu_time_total / 1e6 for e in prof.key_averages()}
    return total, spent.get("ScaledAdam.statistics", 0.0), spent.get("ScaledAdam.update", 0.0)


def breakdown(params: list[torch.nn.Parameter], rounds: int) -> None:
    """Print where a kernel ScaledAdam's step goes, against fused Adam in the same rounds."""
    adam = torch.optim.Adam(copy_params(params), lr=1e-3, fused=True)
    opt = scaled_adam(copy_params(params), True, None)
    rows: dict[str, list[float]] = {
        "Adam fused=True step": [],
        "ScaledAdam step": [],
        "statistics pass": [],
        "update pass": [],
        "rest": [],
    }
    with torch.no_grad():
        for _ in range(2):
            adam.step(), opt.step()
        for _ in range(rounds):
            t = time.perf_counter()
            adam.step()
            rows["Adam fused=True step"].append(time.perf_counter() - t)
            total, stats, update = pass_times(opt)
            rows["ScaledAdam step"].append(total)
            rows["statistics pass"].append(stats)
            rows["update pass"].append(update)
            rows["rest"].append(total - stats - update)
    base = statistics.median(rows["Adam fused=True step"])
    print(f"| part (ScaledAdam, {opt.implementation}) | median ms | fraction of fused Adam's step |")
    print("|---|---:|---:|")
    for name, ts in rows.items():
        print(f"| {name} | {statistics.median(ts) * 1e3:.1f} | {statistics.median(ts) / base:.2f} |")


def variants(params: list[torch.nn.Parameter], eager_all: bool) -> dict[str, Callable[[], object]]:
    v: dict[str, Callable[[], object]] = {
        "Adam fused=True": torch.optim.Adam(copy_params(params), lr=1e-3, fused=True).step,
        "Adam foreach=True": torch.optim.Adam(copy_params(params), lr=1e-3, foreach=True).step,
        "ScaledAdam C++ kernel": scaled_adam(copy_params(params), True, None).step,
        "ScaledAdam eager, per-parameter loop": scaled_adam(copy_params(params), False, 0).step,
    }
    if eager_all:
        v["ScaledAdam eager, all stacked"] = scaled_adam(copy_params(params), False, 1 << 62).step
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12, help="transformer layers (12: about 38M parameters)")
    ap.add_argument("--d-model", type=int, default=512, help="width; the MLP matrices are d x 4d")
    ap.add_argument("--scalars", type=int, default=4, help="one-element parameters")
    ap.add_argument("--rounds", type=int, default=10, help="timed steps per variant, interleaved")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument(
        "--eager-stacked",
        action="store_true",
        help="also time the eager path with every bucket stacked (the layout non-CPU devices use)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = transformer_params(args.layers, args.d_model, args.scalars)
    n = sum(p.numel() for p in params)
    print(f"# {len(params)} tensors, {n / 1e6:.1f}M parameters; {machine_description()}")
    runs = variants(params, args.eager_stacked)
    first: dict[str, float] = {}
    with torch.no_grad():
        for name, step in runs.items():
            t = time.perf_counter()
            step()
            first[name] = time.perf_counter() - t
            step()  # a second warm-up step: allocator and caches settle
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, step in runs.items():
                t = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - t)
    base = statistics.median(times["Adam fused=True"])
    print(f"# after the run: {machine_description()}")
    print("| variant | median ms/step | min ms/step | ratio to fused Adam | first step s |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med * 1e3:.1f} | {min(ts) * 1e3:.1f} | {med / base:.2f} | {first[name]:.1f} |")
    print()
    breakdown(params, args.rounds)


if __name__ == "__main__":
    main()
