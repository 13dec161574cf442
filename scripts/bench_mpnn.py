"""Training-step time of model=mpnn against nash-mtl's `Net` on the same batch of 120 QM9 molecules, in one run.

    PYTHONPATH=. python scripts/bench_mpnn.py [--repeats 5] [--steps 3] [--device cpu] [--threads 2]

Both models get the same parameters and the same real batch (the first molecules of tasks=qm9's training split, with
Complete + Distance edges); a step is forward, the 11 MSE losses summed, backward and an Adam step. Blocks of the
two alternate; the table gives the median seconds per step and ours / reference (goal: <= 0.5x). Needs the chem
extra; reads or builds the 2,000-molecule QM9 cache. The reference module is benchmarks/nash_mtl_net.py.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn import functional as F

from benchmarks.nash_mtl_net import ReferenceNet
from mtl_bench.analysis.machine import machine_description
from mtl_bench.models.mpnn import MPNN
from mtl_bench.tasks.qm9 import QM9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batch", type=int, default=120)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ts = QM9(n_test=500, n_val=500, limit=2000)
    data, targets = ts.train.collate([ts.train[i] for i in range(args.batch)])
    data = data.to(device)
    y = torch.cat([targets[name] for name in ts.task_names], 1).to(device)
    torch.manual_seed(0)
    ref = ReferenceNet(len(ts.task_names)).to(device)
    ours = MPNN((11,), {name: 1 for name in ts.task_names}).to(device)
    state = {f"trunk.{k}": v for k, v in ref.state_dict().items() if not k.startswith("task_specific")}
    for i, name in enumerate(ts.task_names):
        state |= {f"heads.{name}.{p}": getattr(ref.task_specific[i], p) for p in ("weight", "bias")}
    ours.load_state_dict(state)

    def ref_loss() -> torch.Tensor:
        return F.mse_loss(ref(data)[0], y, reduction="none").mean(0).sum()

    def our_loss() -> torch.Tensor:
        preds = ours(data).preds
        return torch.stack([F.mse_loss(preds[n], y[:, i : i + 1]) for i, n in enumerate(ts.task_names)]).sum()

    models = {"nash-mtl Net (reference)": (ref, ref_loss), "mtl-bench mpnn": (ours, our_loss)}
    optimizers = {name: torch.optim.Adam(model.parameters(), lr=1e-3) for name, (model, _) in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    for block in range(args.repeats + 1):  # block 0 warms up
        for name, (model, loss_fn) in models.items():
            for _ in range(args.steps):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                optimizers[name].zero_grad()
                loss_fn().backward()
                optimizers[name].step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if block > 0:
                    times[name].append(time.perf_counter() - start)
    base = statistics.median(times["nash-mtl Net (reference)"])
    print(
        f"{machine_description()}; device {device}, {torch.get_num_threads()} threads; batch {args.batch} molecules, "
        f"{data.num_nodes} nodes, {data.num_edges} edges; {args.repeats} blocks x {args.steps} steps each"
    )
    print("| model | s/step (median) | min | vs reference |\n|---|---:|---:|---:|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {min(values):.3f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
