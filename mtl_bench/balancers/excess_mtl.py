"""He et al., ICML 2024, "Robust Multi-Task Learning with Excess Risks" (ExcessMTL)."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import cpp_kernels
from mtl_bench.balancers.aggregator import Aggregation, Aggregator
from mtl_bench.balancers.checks import number, one_of
from mtl_bench.balancers.weighting import Solution
from mtl_bench.devices import cpu_value
from mtl_bench.gradient_engine.aggregator_balancer import AggregatorBalancer
from mtl_bench.gradient_engine.balancer import task_list
from mtl_bench.gradient_engine.blocks import combine, flat_rows
from mtl_bench.gradient_engine.gradient_balancer import trained
from mtl_bench.gradient_engine.gramian import takes_kernel
from mtl_bench.gradient_engine.rank_average import rank_mean, world_size

TOTALS = ("tasks", "one")
HEAD_WEIGHTS = ("weights", "ones")

# The excess risk of large float32 CPU blocks (takes_kernel: the Gramian kernel's rule) in one C++ pass
# (excess_mtl_cpu.cpp); -ffp-contract=off: no fused multiply-add, so S' has the bits of the torch path.
EXCESS_SOURCE = cpp_kernels.source("excess_mtl_cpu.cpp")
EXCESS_CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-ffp-contract=off"]


def excess_kernel() -> Any:
    """The built excess-risk kernel, or None (said once) where it cannot be built: torch computes the same."""
    return cpp_kernels.build_or_say(
        "mtl_bench_excess_mtl_cpu",
        EXCESS_SOURCE,
        EXCESS_CFLAGS,
        "ExcessMTL",
        "ExcessMTL: the C++ excess-risk kernel cannot be built here ({error}); torch computes it",
    )


class ExcessMTLAggregator(Aggregator):
    """Task weights moved towards the tasks with the largest excess risk, estimated from the gradients:
    e_i = Σ_p g_ip² / √(S_ip + 1e-7), S the running sum of squared gradients (an AdaGrad-style diagonal
    Hessian, the paper's Eq. 6-7). During the first `warmup_steps` steps the weights stay uniform and the
    e_i average into the baseline e⁰; afterwards each step sets w ← total·softmax(log w + η·e/e⁰) (Eq. 9,
    the exponentiated-gradient step, in log space) and trains on d = Σ_i w_i g_i. The g_i are the exact per-task
    gradients at the shared parameters (no grad_source option: there is no shared_rep mode here).

    Reference: the authors' code as in LibMTL main `ExcessMTL` (commit 4336804): weights start at 1 and sum to
    T (`total="tasks"`), the first step's e is the baseline (`warmup_steps=1`) and the heads get the weights
    (`head_weights="weights"`: it trains on Σ w_i L_i). torchjd 0.18 `ExcessMTL` is `total="one"`,
    `head_weights="ones"` and `warmup_steps=n_warmup_steps` for n_warmup_steps >= 1 (its 0 takes the first
    step's e as both baseline and update; it also adds 1e-7 to e⁰). S, the weights, e⁰, the warm-up sum and the
    step count are buffers (S holds T values per shared parameter). Under DDP the squared gradients are averaged
    over the ranks (one all-reduce of T times the shared parameters per step), so every rank holds the same S.

    Large float32 CPU blocks (one process) take a C++ kernel (excess_mtl_cpu.cpp): one pass over J and S that writes
    S' into a buffer kept from step to step (`staging_buffer`), which becomes S by a swap when the step is kept. S'
    has the torch path's bits; e adds the same float terms in double (torch's float32 sum differs by about 1e-6
    relative).

    Metrics: `weight/<task>`, `grad_norm/<task>`, `grad_cos/<a>/<b>`, `excess_mtl/excess/<task>` (e_i / e⁰_i,
    or e_i during the warm-up). The weights do not read the Gramian: the engine computes it for `grad_norm` and
    `grad_cos` only at steps whose measurements are read (`BackwardContext.measure`).
    """

    weights: Tensor
    baseline: Tensor
    warmup_sum: Tensor
    steps: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        shapes: Sequence[torch.Size],
        robust_step_size: float = 1.0,
        warmup_steps: int = 1,
        total: str = "tasks",
        head_weights: str = "weights",
    ) -> None:
        """
        task_names: the tasks, sorted (the order of the rows).
        shapes: the shapes of the shared parameters (one block of T squared-gradient sums each).
        robust_step_size: η of the exponentiated weight update (> 0).
        warmup_steps: steps with uniform weights whose excess risks average into the baseline (>= 1; the
            authors' code: 1; the paper's appendix: 3 epochs of steps).
        total: what the weights sum to: tasks (T, the authors' code) or one (torchjd).
        head_weights: the heads' loss weights: weights (the authors' code) or ones (torchjd).
        """
        super().__init__()
        self.task_names = list(task_names)
        self.robust_step_size = number("robust_step_size", robust_step_size, 0, above=True)
        self.warmup_steps = number("warmup_steps", warmup_steps, 1, integer=True)
        self.total, self.head_weights = (
            one_of("total", total, TOTALS),
            one_of("head_weights", head_weights, HEAD_WEIGHTS),
        )
        self.weighs_heads = head_weights == "weights"
        t = len(self.task_names)
        self._total = float(t) if total == "tasks" else 1.0
        self.register_buffer("weights", torch.full((t,), self._total / t))
        self.register_buffer("baseline", torch.ones(t))
        self.register_buffer("warmup_sum", torch.zeros(t))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        for k, shape in enumerate(shapes):
            self.register_buffer(f"sq_grad_sum_{k}", torch.zeros((t, *shape), dtype=torch.float32))

    def extra_repr(self) -> str:
        return f"robust_step_size={self.robust_step_size}, warmup_steps={self.warmup_steps}"

    def forward(self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor) -> Aggregation:
        state: dict[str, Tensor] = {}
        excess = None
        for k, block in enumerate(blocks):
            e = self._kernel_excess(k, block, scale, state)
            if e is None:
                square = block.float().square()
                square = rank_mean(square / (scale * scale) if scale is not None else square)
                total_sq = state[f"sq_grad_sum_{k}"] = getattr(self, f"sq_grad_sum_{k}") + square
                e = (square / torch.sqrt(total_sq + 1e-7)).reshape(square.shape[0], -1).sum(1)
            excess = e if excess is None else excess + e
        assert excess is not None
        steps = self.steps + 1
        warming = steps <= self.warmup_steps
        warmup_sum = torch.where(warming, self.warmup_sum + excess, self.warmup_sum)
        baseline = torch.where(steps == self.warmup_steps, warmup_sum / self.warmup_steps, self.baseline)
        ratio = excess / baseline
        moved = self._total * torch.softmax(torch.log(self.weights) + self.robust_step_size * ratio, dim=0)
        weights = torch.where(warming, self.weights, moved)
        state.update(weights=weights, baseline=baseline, warmup_sum=warmup_sum, steps=steps)
        metrics = {
            f"excess_mtl/excess/{name}": v for name, v in zip(self.task_names, torch.where(warming, excess, ratio))
        }
        solution = Solution(weights, weights if self.weighs_heads else None, metrics, state)
        # excess: a non-finite gradient makes its task's e non-finite; the losses averaged over the ranks
        return Aggregation(combine(blocks, weights), solution, stats=[weights, excess, rank_mean(losses)])

    def _kernel_excess(
        self, k: int, block: Tensor, scale: Optional[Tensor], state: dict[str, Tensor]
    ) -> Optional[Tensor]:
        """e of block k by the C++ kernel, S' put in `state`; None where the torch path computes it: GPU, float64,
        small blocks, rows not dense, DDP (its squares are averaged over the ranks first), or no kernel."""
        rows = flat_rows(block)
        dense = rows.data_ptr() == block.data_ptr() and rows.stride() == (rows.shape[1], 1)  # a view, no gaps
        if world_size() > 1 or not dense or not takes_kernel(block[0], block.shape[0]):
            return None
        module = excess_kernel()
        if module is None:
            return None
        name = f"sq_grad_sum_{k}"
        committed = self._buffers[name]
        assert committed is not None
        if committed.stride() != block.stride():  # S laid out as J's rows (once): one order for both
            committed = self._buffers[name] = torch.empty_like(block).copy_(committed)
        spare = self.staging_buffer(name, block)  # S' becomes S by trading places with it at the commit
        scale_sq = 1.0 if scale is None else float(cpu_value(scale * scale))
        e = module.excess(rows, flat_rows(committed), flat_rows(spare), scale_sq)
        state[name] = spare
        return e


class ExcessMTL(AggregatorBalancer):
    """ExcessMTL (`ExcessMTLAggregator`) as a balancer: `balancer=excess_mtl`; at the shared parameters."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        robust_step_size: float = 1.0,
        warmup_steps: int = 1,
        total: str = "tasks",
        head_weights: str = "weights",
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        robust_step_size: η of the exponentiated weight update (> 0).
        warmup_steps: steps with uniform weights whose excess risks average into the baseline (>= 1; the
            authors' code: 1; the paper's appendix: 3 epochs of steps).
        total: what the weights sum to: tasks (T, the authors' code) or one (torchjd).
        head_weights: the heads' loss weights: weights (the authors' code) or ones (torchjd).
        """
        params = trained(shared_params)
        tasks = sorted(task_list(type(self), task_names))
        shapes = [p.shape for p in params]
        aggregator = ExcessMTLAggregator(tasks, shapes, robust_step_size, warmup_steps, total, head_weights)
        super().__init__(task_names, params, aggregator)
        if world_size() == 1 and any(takes_kernel(p, len(tasks)) for p in params):
            excess_kernel()  # built now, with the run's other parts, rather than inside its first timed step
