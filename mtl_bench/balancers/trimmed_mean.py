"""Yin et al., ICML 2018, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates" (trimmed mean)."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import cpp_kernels
from mtl_bench.balancers.aggregator import Aggregation, Aggregator
from mtl_bench.balancers.checks import number
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.aggregator_balancer import AggregatorBalancer
from mtl_bench.gradient_engine.balancer import task_list
from mtl_bench.gradient_engine.blocks import flat_rows, unflatten_row
from mtl_bench.gradient_engine.gramian import GRAMIAN_CFLAGS, takes_kernel

TRIM_SOURCE = cpp_kernels.source("trimmed_mean_cpu.cpp")


class TrimmedMeanAggregator(Aggregator):
    """Coordinate-wise trimmed mean of the task gradients: in every coordinate of the shared parameters the
    `trim` largest and `trim` smallest of the T values are dropped and the other T − 2·trim averaged. Not a
    weighting of whole gradients, so the direction is built per parameter block (a sort over the T rows;
    with `trim=1` one max and one min, `drop_extremes`, or its C++ kernel on large float32 CPU blocks:
    `block_drop_extremes`) instead of from the Gramian. Needs T ≥ 2·trim + 1. The gradients are those of the
    shared parameters (no grad_source option: there is no shared_rep mode here).

    Reference: torchjd 0.18 `TrimmedMean` (`trim_number`). The heads get their own gradients (weight 1), as
    torchjd's mtl_backward gives them. Under DDP each rank trims its own gradients and DDP averages the
    results (the trimmed mean of the global batch would need the whole T×P Jacobian from every rank).

    Metrics: `weight/<task>` (the share of coordinates in which g_i was kept, divided by T − 2·trim, so the
    weights of the plain mean are 1/T each), `grad_norm/<task>`, `grad_cos/<a>/<b>` (from the Gramian, computed
    only at steps whose measurements are read: `BackwardContext.measure`).
    """

    def __init__(self, tasks: int, trim: int = 1) -> None:
        """
        tasks: T, the number of tasks.
        trim: how many of the largest and of the smallest values each coordinate drops (>= 0; needs T >= 2·trim + 1).
        """
        super().__init__()
        note = f"for {tasks} tasks (at most (T - 1) // 2)"
        self.trim = number("trim", trim, 0, (tasks - 1) // 2, integer=True, note=note)

    def extra_repr(self) -> str:
        return f"trim={self.trim}"

    def _sorted_mean(self, block: Tensor) -> tuple[Tensor, Tensor]:
        """The mean of the middle T − 2·trim values of every coordinate, and how often each row is among them."""
        t, kept = block.shape[0], block.shape[0] - 2 * self.trim
        ordered, rows = torch.sort(block, dim=0)
        middle = rows.narrow(0, self.trim, kept).reshape(-1)
        return ordered.narrow(0, self.trim, kept).mean(dim=0), torch.bincount(middle, minlength=t)

    def forward(self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor) -> Aggregation:
        t = blocks[0].shape[0]
        kept = t - 2 * self.trim
        directions, counts, total = [], torch.zeros(t, device=blocks[0].device), 0
        for block in blocks:  # the trimmed mean is homogeneous: scaled J, scaled result
            direction, kept_counts = block_drop_extremes(block) if self.trim == 1 else self._sorted_mean(block)
            directions.append(direction)
            counts += kept_counts.to(counts.dtype)
            total += block[0].numel()
        return Aggregation(directions, Solution(counts / (total * kept)))


class TrimmedMean(AggregatorBalancer):
    """TrimmedMean (`TrimmedMeanAggregator`) as a balancer: `balancer=trimmed_mean`; at the shared parameters."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        trim: int = 1,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        trim: how many of the largest and of the smallest values each coordinate drops (>= 0; needs T >= 2·trim + 1).
        """
        super().__init__(task_names, shared_params, TrimmedMeanAggregator(len(task_list(type(self), task_names)), trim))
        if trim == 1 and any(takes_kernel(p, len(self.task_names)) for p in self._params):
            trim_kernel()  # built now, with the run's other parts, rather than inside its first timed step


def drop_extremes(block: Tensor) -> tuple[Tensor, Tensor]:
    """`trim=1`: the mean of every coordinate's T values without its largest and its smallest, and how often each
    row is kept. One max and one min over the rows instead of a sort (about 2x faster at T=10 on one CPU thread). The
    max is the first row holding it and the min the last one, so the two differ even where all T values are equal.
    The kept values are summed, not the total minus the extremes: an outlier cannot cancel the others' digits."""
    t = block.shape[0]
    high = block.max(dim=0, keepdim=True).indices  # max/min with indices: about 5x argmax/argmin along dim 0 on CPU
    low = t - 1 - block.flip(0).min(dim=0, keepdim=True).indices
    dropped = torch.zeros_like(block, dtype=torch.bool)
    dropped.scatter_(0, high, True).scatter_(0, low, True)
    direction = block.masked_fill(dropped, 0).sum(dim=0) / (t - 2)
    removed = torch.bincount(high.reshape(-1), minlength=t) + torch.bincount(low.reshape(-1), minlength=t)
    return direction, block[0].numel() - removed


def block_drop_extremes(block: Tensor) -> tuple[Tensor, Tensor]:
    """`drop_extremes` for one (T, *shape) block: the C++ kernel (trimmed_mean_cpu.cpp: one read of the block instead
    of six fresh T×P tensors, about 30x faster at T=10) for large float32 CPU blocks, the torch path otherwise (GPU,
    float64, small blocks, or no kernel). The same rows are dropped and kept; the kernel sums the kept values in
    double, the torch path in float, so the directions differ by float rounding only."""
    if takes_kernel(block[0], block.shape[0]):
        m = flat_rows(block)  # a view: task_jacobian's rows are dense
        module = trim_kernel() if m.stride(1) == 1 else None
        if module is not None:
            direction, kept = module.drop_extremes(m)
            return unflatten_row(direction, block), kept
    return drop_extremes(block)


def trim_kernel() -> Any:
    """The built trim=1 kernel, or None (said once) where it cannot be built: `drop_extremes` computes the same."""
    return cpp_kernels.build_or_say(
        "mtl_bench_trimmed_mean_cpu",
        TRIM_SOURCE,
        GRAMIAN_CFLAGS,
        "TrimmedMean (trim=1)",
        "TrimmedMean: the C++ trim=1 kernel cannot be built here ({error}); torch computes it",
    )
