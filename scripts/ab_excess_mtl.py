"""ExcessMTL's training step with its C++ excess-risk kernel against its torch path, the floor and PCGrad, interleaved.

    OMP_NUM_THREADS=1 python scripts/ab_excess_mtl.py [--tasks 10] [--rounds 7] [--steps 2]

The zoo benchmark's configuration (scripts/bench_balancers.py --peers: HPS MLP 250 -> 4x512, scalar heads, batch
256, one thread). "torch path" is the same balancer with the kernel turned off; PCGrad (a Gramian method, nothing
per coordinate) shows what ExcessMTL costs beyond J, its Gramian and the combination. Medians over rounds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_balancers import Runner, _floor, _ours  # noqa: E402

from mtl_bench.analysis.machine import machine_description  # noqa: E402
from mtl_bench.balancers import ExcessMTL  # noqa: E402
from mtl_bench.bench.runs import hps_mlp  # noqa: E402
from mtl_bench.bench.timing import interleaved, markdown_table, medians, ratio, seconds_per_call  # noqa: E402


class TorchPathExcessMTL(ExcessMTL):
    """ExcessMTL with the kernel turned off: every block through the torch ops."""

    def _kernel_excess(self, k, block, scale):
        return None


def torch_path(model, names):
    return TorchPathExcessMTL(names, list(model.shared_parameters()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="steps per timed block")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = hps_mlp(512, 4, args.tasks, 1)
    x = torch.randn(256, 250)
    targets = {f"t{i}": torch.randn(256, 1) for i in range(args.tasks)}
    makers = {
        "floor": _floor,
        "PCGrad": _ours("PCGrad"),
        "ExcessMTL: torch path": torch_path,
        "ExcessMTL: kernel": _ours("ExcessMTL"),
    }
    runners = {name: Runner(model, make, x, targets) for name, make in makers.items()}
    for runner in runners.values():
        runner.step()  # warm: J, the kept buffers
    times = medians(
        interleaved({k: lambda r=r: seconds_per_call(r.step, args.steps) for k, r in runners.items()}, args.rounds)
    )
    print(f"{machine_description()}; T={args.tasks}, {args.rounds} rounds x {args.steps} steps\n")
    rows = [[k, f"{v * 1e3:.1f}", ratio(v, times["floor"])] for k, v in times.items()]
    print(markdown_table(["variant", "ms/step", "x floor"], rows))


if __name__ == "__main__":
    main()
