"""The gradient methods' per-step pieces on the zoo benchmark's Jacobian, each against its torch baseline.

    python scripts/bench_gramian.py [--tasks 10] [--rounds 15] [--calls 5] [--threads 1]

J has one (T, *shape) block per shared parameter of the HPS trunk of scripts/bench_balancers.py (250 -> 4x512:
weights 512x250 and 3 x 512x512, biases 512), laid out as task_jacobian writes it. Rows: the Gramian Σ J_b J_bᵀ
through `gramian.gramian` (the C++ kernel for the large blocks) against torch.mm on every block, TrimmedMean's
trim=1 direction against the sort it replaces, in torch (`drop_extremes`) and as the method runs it
(`block_drop_extremes`: the C++ kernel for the large blocks), and ExcessMTL's excess risk (S' = S + g², e) by its
C++ kernel, writing S' into a kept buffer, against the torch ops it replaces (and its commit, S' copied into S, as
`StagedBalancer._commit` does it). Variants run interleaved; medians. Prints a markdown table.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.timing import interleaved, markdown_table, medians, ratio, seconds_per_call
from mtl_bench.analysis.machine import machine_description
from mtl_bench.balancers import excess_mtl, trimmed_mean
from mtl_bench.balancers.trimmed_mean import block_drop_extremes, drop_extremes
from mtl_bench.gradient_engine.blocks import flat_rows
from mtl_bench.gradient_engine.gramian import gramian, gramian_kernel

SHAPES = [(512, 250), (512,), (512, 512), (512,), (512, 512), (512,), (512, 512), (512,)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=5, help="calls per timed block")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if gramian_kernel() is None or excess_mtl.excess_kernel() is None or trimmed_mean.trim_kernel() is None:
        raise SystemExit("bench_gramian: a C++ kernel cannot be built here (see the warning above)")
    generator = torch.Generator().manual_seed(0)
    # a Linear's weight gradient comes transposed: rows laid out as autograd returns them, as task_jacobian keeps
    blocks = [torch.randn(args.tasks, *reversed(s), generator=generator).transpose(1, -1) for s in SHAPES]

    def mm_gramian() -> torch.Tensor:
        return sum(m @ m.T for m in map(flat_rows, blocks))

    sums = [torch.rand_like(b) for b in blocks]  # S, laid out as the blocks (ExcessMTL keeps it so)
    kept = [torch.empty_like(b) for b in blocks]  # S', kept from step to step
    keep = torch.ones((), dtype=torch.bool)

    def torch_excess() -> None:
        for block, s in zip(blocks, sums):
            square = block.square()
            total = s + square
            (square / torch.sqrt(total + 1e-7)).reshape(args.tasks, -1).sum(1)

    def kernel_excess() -> None:
        module = excess_mtl.excess_kernel()
        for block, s, out in zip(blocks, sums, kept):
            module.excess(flat_rows(block), flat_rows(s), flat_rows(out), 1.0)

    def sorted_trim() -> None:
        for block in blocks:
            ordered, rows = torch.sort(block, dim=0)
            ordered.narrow(0, 1, args.tasks - 2).mean(dim=0)
            torch.bincount(rows.narrow(0, 1, args.tasks - 2).reshape(-1), minlength=args.tasks)

    variants = {
        "Gramian: torch.mm": mm_gramian,
        "Gramian: gramian.gramian (kernel)": lambda: gramian(blocks),
        "TrimmedMean trim=1: sort": sorted_trim,
        "TrimmedMean trim=1: drop_extremes": lambda: [drop_extremes(block) for block in blocks],
        "TrimmedMean trim=1: kernel": lambda: [block_drop_extremes(block) for block in blocks],
        "ExcessMTL excess risk: torch": torch_excess,
        "ExcessMTL excess risk: kernel": kernel_excess,
        "ExcessMTL commit: torch.where into S": lambda: [torch.where(keep, o, s, out=s) for o, s in zip(kept, sums)],
    }
    times = medians(
        interleaved({k: lambda f=f: seconds_per_call(f, args.calls) for k, f in variants.items()}, args.rounds)
    )
    baselines = ["Gramian: torch.mm", "TrimmedMean trim=1: sort", "ExcessMTL excess risk: torch"]
    base = {k: times[next(b for b in baselines if k.split()[0] == b.split()[0])] for k in times}
    floats = sum(b.numel() for b in blocks)
    print(f"{machine_description()}; T={args.tasks}, J of {floats / 1e6:.1f} M floats\n")
    print(
        markdown_table(
            ["piece", "ms", "x baseline"], [[k, f"{v * 1e3:.2f}", ratio(v, base[k])] for k, v in times.items()]
        )
    )


if __name__ == "__main__":
    main()
