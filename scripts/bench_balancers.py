"""Full training-step time and peak memory of each loss balancer relative to fixed weights, measured in one run.

    python scripts/bench_balancers.py [--rounds 5] [--steps 4] [--device cpu] [--threads 1]
        [--tasks 2,10,40] [--head-dims 100,1] [--generic]

A step is what the trainer does: zero_grad, forward, per-task MSE losses, the balancer's backward, an Adam
step, `balancer.step()`. Models: the GradNorm paper's toy MLP (input 250, four shared ReLU layers of 100,
T=10, batch 100) and a wider MLP (four shared layers of 512, batch 256) with T = 2, 10, 40 heads of
each size in --head-dims (100: the toy task's targets; 1: scalar heads, where the balancer's own work is
the largest share of the step). Variants of one configuration run interleaved, round after round, and
each time is the median over rounds, so a background load that drifts hits all variants alike.
Peak memory is the high-water mark, during one step, of the memory allocated in that step (CPU: replayed
from the profiler's allocation events; CUDA: max_memory_allocated above the level before the step).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mtl_bench.analysis.machine import machine_description
from mtl_bench.balancers import Balancer, FixedWeights, GradNorm, RescaledNormBalancer
from mtl_bench.models.base import MultiTaskModel


def build_model(width: int, layers: int, tasks: int, head_dim: int, input_dim: int = 250) -> MultiTaskModel:
    modules: list[nn.Module] = []
    size = input_dim
    for _ in range(layers):
        modules += [nn.Linear(size, width), nn.ReLU()]
        size = width
    trunk = nn.Sequential(*modules)
    heads = {f"t{i}": nn.Linear(width, head_dim) for i in range(tasks)}
    return MultiTaskModel(trunk, heads, last_shared_layer=modules[-2])


VARIANTS: dict[str, Callable[[MultiTaskModel, list[str]], Balancer]] = {
    "fixed": lambda model, names: FixedWeights({n: 1.0 for n in names}),
    "rescaled_norm": lambda model, names: RescaledNormBalancer({n: 1.0 for n in names}),
    "gradnorm shared_rep": lambda model, names: GradNorm(names, grad_source="shared_rep"),
    "gradnorm last_shared": lambda model, names: GradNorm(names, shared_layer=model.last_shared_layer),
}
GENERIC = ("gradnorm last_shared (generic autograd)",
           lambda model, names: GradNorm(names, shared_params=model.last_shared_layer.parameters()))


class Runner:
    """One variant of one configuration: its own copy of the model, optimizer and balancer."""

    def __init__(self, model: MultiTaskModel, make: Callable[[MultiTaskModel, list[str]], Balancer],
                 x: torch.Tensor, targets: dict[str, torch.Tensor]) -> None:
        self.model = copy.deepcopy(model)
        self.balancer = make(self.model, list(targets)).to(x.device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.x, self.targets = x, targets

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        out = self.model(self.x)
        losses = {name: F.mse_loss(out.preds[name], y) for name, y in self.targets.items()}
        self.balancer.backward(losses, out.shared)
        self.opt.step()
        self.balancer.step()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(runner: Runner, steps: int, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        runner.step()
    sync(device)
    return (time.perf_counter() - start) / steps


def peak_step_memory(runner: Runner, device: torch.device) -> float:
    """Bytes live at the high-water mark of one step, counting only blocks allocated during the step."""
    if device.type == "cuda":
        sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        runner.step()
        sync(device)
        return float(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        runner.step()
    # CPU has no allocator statistics: replay the profiler's allocation events. Frees of blocks that were
    # allocated before the step (last step's gradients) are ignored, so the peak is not understated.
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        with open(f"{tmp}/trace.json") as f:
            trace = json.load(f)["traceEvents"]
    events = sorted((e["ts"], e["args"]["Addr"], e["args"]["Bytes"]) for e in trace if e.get("name") == "[memory]")
    live: dict[int, int] = {}
    level = peak = 0
    for _, addr, nbytes in events:
        if nbytes > 0:
            live[addr] = nbytes
            level += nbytes
        elif addr in live:
            level -= live.pop(addr)
        peak = max(peak, level)
    return float(peak)


def bench_config(label: str, model: MultiTaskModel, batch: int, head_dim: int, variants: dict,
                 rounds: int, steps: int, device: torch.device) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    names = list(model.heads)
    x = torch.randn(batch, 250, generator=g).to(device)
    targets = {n: torch.randn(batch, head_dim, generator=g).to(device) for n in names}
    model = model.to(device)
    runners = {name: Runner(model, make, x, targets) for name, make in variants.items()}
    for runner in runners.values():  # warm-up: allocator, lazy state, first-step L_i(0)
        time_steps(runner, 2, device)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            times[name].append(time_steps(runner, steps, device))
    memory = {name: peak_step_memory(runner, device) for name, runner in runners.items()}
    base_t, base_m = statistics.median(times["fixed"]), memory["fixed"]
    rows = []
    for name in runners:
        t = statistics.median(times[name])
        rows.append({"model": label, "T": len(names), "head": head_dim, "balancer": name, "ms": 1e3 * t,
                     "x_time": t / base_t, "mb": memory[name] / 2**20, "x_mem": memory[name] / base_m})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; times are medians over them")
    parser.add_argument("--steps", type=int, default=4, help="steps timed per round")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: steadier ratios on a small shared machine; 0: torch's default)")
    parser.add_argument("--tasks", default="2,10,40", help="task counts of the wide MLP")
    parser.add_argument("--head-dims", default="100,1", help="output sizes of the wide MLP's heads")
    parser.add_argument("--generic", action="store_true", help="also GradNorm's generic per-parameter path")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    variants = dict(VARIANTS)
    if args.generic:
        variants[GENERIC[0]] = GENERIC[1]

    torch.manual_seed(0)
    configs = [("toy MLP 4x100, batch 100", build_model(100, 4, 10, 100), 100, 100)]
    for head_dim in (int(h) for h in args.head_dims.split(",")):
        for tasks in (int(t) for t in args.tasks.split(",")):
            configs.append(("wide MLP 4x512, batch 256", build_model(512, 4, tasks, head_dim), 256, head_dim))

    started = time.perf_counter()
    rows = []
    for label, model, batch, head_dim in configs:
        rows += bench_config(label, model, batch, head_dim, variants, args.rounds, args.steps, device)
    print(f"{machine_description()}; on {device.type}, {args.rounds} rounds x {args.steps} steps, "
          f"{time.perf_counter() - started:.0f} s in all\n")
    print("| model | T | head out | balancer | ms/step | x fixed | peak MB/step | x fixed |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['T']} | {r['head']} | {r['balancer']} | {r['ms']:.1f} | {r['x_time']:.2f} "
              f"| {r['mb']:.1f} | {r['x_mem']:.2f} |")


if __name__ == "__main__":
    main()
