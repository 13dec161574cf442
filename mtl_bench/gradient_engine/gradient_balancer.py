"""The base class of the gradient-combining methods: one step from per-task gradients to `.grad`.

The methods of this family (PCGrad, MGDA, IMTL, UPGrad, CAGrad, Aligned-MTL, Nash-MTL, GradVac) all end in
a shared direction d = Σ_i w_i g_i, a combination of the tasks' gradients g_i at the shared parameters (or
at the shared representation), with weights w computed from the T×T Gramian G = J Jᵀ of the Jacobian J whose
rows are the g_i. So one step here is:

1. `grad_source="shared_params"`: one backward per task through its head and the trunk (`task_grads.task_jacobian`),
   each written into row i of J, one (T, *p.shape) block per shared parameter, as it arrives; also each
   head's own parameter gradient. Exact through every path, also where `shared` is not a cut (SegNet-MTAN:
   each task's attention modules read the shared features of every stage). This is the floor's work (T
   backwards); one batched vector-Jacobian product through the trunk (tests/helpers/param_jacobian.py, under
   vmap) did the same arithmetic 1.1-1.3x slower on one CPU thread.
2. `grad_source="shared_rep"`: T gradients at `shared` (the trunk's output) through the heads, one small
   backward per task that stops at `shared` (`task_grads.grads_at_shared`); J is those gradients, flattened (MGDA-UB).
   It assumes `shared` is a cut: every loss reaches the shared parameters only through `shared`. A walk over
   each loss's autograd graph (`graph.task_params`) checks it at every step; where it fails, `shared_rep` (and
   GradDrop) cannot be exact and raise.
3. G = Σ_blocks J_b J_bᵀ (`gramian.gramian`: no concatenated copy of J; large float32 CPU blocks through a C++ kernel,
   gramian_cpu.cpp, about 3x faster than torch.mm on this shape: scripts/bench_gramian.py), unscaled (divided
   by the loss scale squared); under DDP averaged over the ranks, so every rank solves the same problem and gets
   the same weights.
4. The method turns G into weights (most on the CPU: T×T problems, see `host.host_gramian`).
5. d = Σ_i w_i g_i per block, and everything lands in `.grad` through ONE autograd call on the leaves
   (`leaf_grads.write_leaf_grads`): it adds to existing gradients (per-task mode and gradient accumulation add up) and
   fires DDP's gradient hooks, so DDP all-reduces the direction as it would a plain backward. With
   `shared_rep` the direction at `shared` goes back through the trunk instead.

The heads' parameters get the gradient of Σ_i c_i L_i with c_i = 1 (the papers; LibMTL and torchjd do the
same) unless a method says otherwise (Nash-MTL: its weights; IMTL-L: the loss scales), through its solution.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.checks import one_of
from mtl_bench.balancers.weighting import Solution, check_measurements, check_solution
from mtl_bench.errors import ContractError
from mtl_bench.gradient_engine.balancer import Context
from mtl_bench.gradient_engine.blocks import combine
from mtl_bench.gradient_engine.gramian import build_kernel_for, gram_metrics, gramian
from mtl_bench.gradient_engine.graph import NOT_A_CUT, task_params
from mtl_bench.gradient_engine.leaf_grads import GradientShapeError, leaf_grads_root, write_leaf_grads
from mtl_bench.gradient_engine.rank_average import rank_mean
from mtl_bench.gradient_engine.staged import JOINT, PER_TASK, StagedBalancer, scaled_grad
from mtl_bench.gradient_engine.task_grads import grads_at_shared, task_jacobian

GRAD_SOURCES = ("shared_params", "shared_rep")


def trained(shared_params: Optional[Iterable[Tensor]]) -> list[Tensor]:
    """The shared parameters that take gradients: J's blocks, in order (a method's per-block buffers follow them)."""
    return [p for p in (shared_params or []) if p.requires_grad]


class GradientBalancer(StagedBalancer):
    """The gradient engine: gathers the per-task gradients (J) of a step and writes the direction back.

    A Gramian method is a `Weighting` run by `GramianBalancer` (a subclass) and never sees this class. A method that
    needs the gradients themselves (per-coordinate state, masks, the gradients of several batches) subclasses it
    and implements the aggregator contract, `aggregate(blocks, scale, losses, shared) -> metrics`: `blocks`, J as
    one (T, *p.shape) block per shared parameter (`blocks.flat_rows` views one as (T, P)) or, with shared_rep, one
    (T, *shared.shape) block, of the scaled gradients (`scale`: the loss scale, None without one), summed over the
    step's micro-batches; `losses`: (T,) the step's mean losses. It writes the direction (`write_direction`) and
    returns its measurements. The default `aggregate` solves `_solve(gram, losses)` on the Gramian and writes
    Σ_i w_i g_i.

    `grad_source`: "shared_params" (the exact per-task gradients at the model's shared parameters; LibMTL's
    rep_grad=False, torchjd's mtl_backward) or "shared_rep" (the gradients at the shared representation
    passed to backward, flattened over the batch: MGDA-UB; cheap: no per-task trunk backward). A method with one
    mode passes it here and has no grad_source option of its own (a key with one legal value). shared_rep needs
    every prediction to read the shared parameters only through that representation (a ValueError at the first
    backward otherwise, e.g. on SegNet-MTAN); shared_params is exact either way (see the module docstring).

    Gradient accumulation (k micro-batches) with shared_params: the micro-batches' Jacobians are summed and
    the method solves once, at the k-th backward, on the Jacobian of the whole accumulated batch, as if it
    were one batch. With shared_rep each micro-batch is solved on its own (the trunk graph of a micro-batch
    is gone by the next one).

    Per-task mode (`backward_task`, each task on its own batch): each task's gradient at the shared
    parameters is collected (its head's gradient lands at once unless the method weights heads by its
    solution); when every task has had its backward (k times under accumulation), that last backward
    solves and writes the combination. It must happen there, not in `step()`, which runs after the
    optimizer step. shared_rep has no per-task mode (the tasks' representations come from different
    batches and their trunk graphs are gone).

    Under DDP the Gramian (and the losses) are averaged over the ranks before the solve, so all ranks get the
    same weights w; each rank's direction w·J_rank goes through DDP's all-reduce, which makes it w·mean(J).
    The weights are thus solved on the mean of the ranks' Gramians, not on the Gramian of the mean Jacobian
    (that would need an all-reduce of the whole T×P Jacobian, T times DDP's own gradient traffic).
    """

    _params: list[Tensor]  # set through __dict__ in __init__ (not registered with the module)

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]],
        grad_source: str,
        gramian_kernel: bool = True,
    ) -> None:
        """gramian_kernel: build the C++ Gramian kernel now (False: for a method that takes no Gramian of J; one
        asked for later is built then)."""
        super().__init__(task_names)
        self.grad_source = one_of("grad_source", grad_source, GRAD_SOURCES)
        self.heads_wait = False  # True: the heads' gradients wait for the solve's head weights
        params = trained(shared_params)
        if grad_source == "shared_params" and not params:
            raise ValueError("shared_params: grad_source=shared_params needs the model's shared parameters")
        self.__dict__["_params"] = params  # the model's: kept out of this module's registry and state_dict
        self._param_ids = {id(p) for p in params}
        self._spare: Optional[list[Tensor]] = None  # last step's Jacobian blocks, rewritten by the next step
        self._clear_step()
        if grad_source == "shared_params" and gramian_kernel:
            build_kernel_for(params, len(self.task_names))

    def _clear_step(self) -> None:
        self._blocks: Optional[list[Tensor]] = None  # the step's summed Jacobian blocks
        self._losses_sum: Optional[Tensor] = None
        self._seen: dict[str, int] = {}  # backwards per task (per-task mode) or "joint"
        self._task_blocks: dict[str, list[Tensor]] = {}
        self._held: list[tuple[int, Tensor, Tensor]] = []  # (task index, head param, grad) awaiting weights

    def _reset(self) -> None:
        super()._reset()
        if hasattr(self, "_seen"):
            self._clear_step()

    def extra_repr(self) -> str:
        return f"tasks={self.task_names}, grad_source={self.grad_source}"

    # ------------------------------------------------------------------ what a method implements

    def _solve(self, gram: Tensor, losses: Tensor) -> Solution:
        """Weights from the unscaled, rank-averaged Gramian (T, T) (`_step_gramian`) and the step's mean losses (T,)."""
        raise NotImplementedError

    def _step_gramian(self, blocks: Sequence[Tensor], scale: Optional[Tensor]) -> Optional[Tensor]:
        """The Gramian `_solve` gets (None: the method does not read it and no measurement asks for it)."""
        return self._unscaled_gramian(blocks, scale)

    @staticmethod
    def _unscaled_gramian(blocks: Sequence[Tensor], scale: Optional[Tensor]) -> Tensor:
        """G of the unscaled gradients (the blocks hold the scaled ones), averaged over the ranks."""
        gram = gramian(blocks)
        return rank_mean(gram / (scale * scale) if scale is not None else gram)

    # ------------------------------------------------------------------ the step

    def _steps(self) -> int:
        return self._ctx.accumulation_steps if self._ctx is not None else 1

    def _heads(self, heads: list[list[tuple[Tensor, Tensor]]], indices: Sequence[int]) -> list[tuple[Tensor, Tensor]]:
        """Head gradients to write now (weight 1), or, when the heads wait for the solve's weights, held for it."""
        pairs = []
        for i, task_heads in zip(indices, heads):
            for p, g in task_heads:
                if self.heads_wait:
                    self._held.append((i, p, g))
                else:
                    pairs.append((p, g))
        return pairs

    def aggregate(
        self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor, shared: Optional[Tensor]
    ) -> dict[str, Tensor]:
        """Solve on the summed Jacobian, write d (and any held heads); return the step's measurements."""
        gram = self._step_gramian(blocks, scale)
        losses = rank_mean(losses)
        self._require_finite(*([gram] if gram is not None else []), losses)
        solution = self._solve(gram, losses)  # type: ignore[arg-type]  # None only for a method that ignores it
        return self.write_direction(blocks, solution, gram, shared)

    def _aggregate_checked(
        self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor, shared: Optional[Tensor]
    ) -> dict[str, Tensor]:
        """`aggregate`, its result held to the contract: gradients of the leaves' shapes, 0-d measurements."""
        try:
            metrics = self.aggregate(blocks, scale, losses, shared)
        except GradientShapeError as err:
            raise ContractError(f"{self.part_name} wrote {err}") from None
        if not isinstance(metrics, dict):
            raise ContractError(
                f"{self.part_name}: aggregate returned {type(metrics).__name__}; the contract: a dict of 0-d tensors"
            )
        check_measurements(metrics, self.part_name)
        return metrics

    def write_direction(
        self, blocks: list[Tensor], solution: Solution, gram: Optional[Tensor], shared: Optional[Tensor]
    ) -> dict[str, Tensor]:
        """Write Σ_i w_i J_i per block (and the heads held for the solve) into `.grad`, or with shared_rep back
        through the trunk; return `weight/<task>`, the Gramian's measurements when measuring, and the solution's."""
        weights = solution.weights
        per_block = len(blocks) if isinstance(weights, Tensor) and weights.dim() == 2 else None
        check_solution(solution, len(self.task_names), per_block, blocks[0], self.part_name)
        if self._finite is not None:  # the inputs were finite (_require_finite): NaN weights are the method's
            self.nonfinite_weights = self._finite & ~torch.isfinite(weights).all()
        pairs = [
            (p, g * solution.head_weights[i].to(g.dtype) if solution.head_weights is not None else g)
            for i, p, g in self._held
        ]
        self._held = []
        if shared is not None:  # shared_rep: the direction at the representation goes back through the trunk
            (direction,) = combine(blocks, solution.weights)
            heads = [leaf_grads_root(pairs)] if pairs else []
            torch.autograd.backward([shared, *heads], [direction.to(shared.dtype), *[None] * len(heads)])
        else:  # the directions and heads' gradients are made here: autograd keeps them as `.grad` without a copy
            pairs[:0] = zip(self._params, combine(blocks, solution.weights))
            write_leaf_grads(pairs)
        weights = weights if weights.dim() == 1 else weights.mean(0)
        metrics = {tags.weight(n): v for n, v in zip(self.task_names, weights.unbind())}
        if gram is not None and self.measuring:
            metrics.update(gram_metrics(gram, self.task_names))
        metrics.update(solution.metrics)
        return metrics

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        self.check_losses(losses)
        scale = self._begin(JOINT, ctx, shared)
        ordered = [losses[name] for name in self.task_names]
        loss_values = torch.stack([loss.detach().float() for loss in ordered])
        if self.grad_source == "shared_rep":
            found = [task_params(loss, shared, self._param_ids) for loss in ordered]
            if not all(cut for _, cut in found):
                raise ValueError(f"grad_source: shared_rep: {NOT_A_CUT}")
            rows, heads = grads_at_shared(ordered, shared, scale, self._param_ids, [p for p, _ in found])
            pairs = self._heads(heads, range(len(ordered)))
            write_leaf_grads(pairs) if pairs else None
            metrics = self._aggregate_checked([rows], scale, self._mean("losses", loss_values), shared)
            self._end_joint()
            return metrics
        if self._seen.get("joint", 0) >= self._steps():  # the k-th backward wrote the update; step() never came
            self._reset()
            raise RuntimeError(
                f"{type(self).__name__}: the previous step's update is still pending; call balancer.step() after "
                "each optimizer step (after scaler.update() when there is a grad scaler)"
            )
        spare = self._spare if self._blocks is None else None  # never the accumulator of this step's micro-batches
        self._spare = None  # while the blocks are in use
        blocks, heads = task_jacobian(ordered, shared, self._params, scale, self._param_ids, spare)
        write_leaf_grads(self._heads(heads, range(len(ordered))))
        self._add_blocks(blocks)
        self._losses_sum = loss_values if self._losses_sum is None else self._losses_sum + loss_values
        self._seen["joint"] = self._seen.get("joint", 0) + 1
        if self._seen["joint"] < self._steps():
            return {}
        assert self._blocks is not None  # set by _add_blocks above
        metrics = self._aggregate_checked(self._blocks, scale, self._losses_sum / self._seen["joint"], None)
        self._spare, self._blocks = self._blocks, None  # no method keeps them past its solve
        self._end_joint()
        return metrics

    def _add_blocks(self, blocks: list[Tensor]) -> None:
        if self._blocks is None:
            self._blocks = blocks
        else:
            torch._foreach_add_(self._blocks, blocks)

    def per_task_problem(self) -> Optional[str]:
        if self.grad_source == "shared_rep":
            return (
                f"{type(self).__name__}: grad_source=shared_rep has no per-task mode (each task's "
                "representation comes from its own batch); use grad_source=shared_params"
            )
        return None

    def backward_task(self, task: str, loss: Tensor, shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        problem = self.per_task_problem()
        if problem is not None:
            raise RuntimeError(problem)
        if task not in self._index:
            raise KeyError(f"task {task!r} is not one of the balancer's tasks {self.task_names}")
        scale = self._begin(PER_TASK, ctx, shared)
        i = self._index[task]
        if self._seen.get(task, 0) >= self._steps():
            raise RuntimeError(
                f"task {task!r} already had its backward in this step; call balancer.step() once per optimizer step"
            )
        params, _ = task_params(loss, shared, self._param_ids)  # exact whether or not `shared` is a cut
        grads = scaled_grad(loss, [*self._params, *params], scale, allow_unused=True)
        shared_grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, self._params)]
        head = [(p, g) for p, g in zip(params, grads[len(self._params) :]) if g is not None]
        write_leaf_grads(self._heads([head], [i]))
        if task in self._task_blocks:
            torch._foreach_add_(self._task_blocks[task], shared_grads)
        else:
            self._task_blocks[task] = shared_grads
        self._collect(task, loss=loss.detach().float())
        self._seen[task] = self._seen.get(task, 0) + 1
        if any(self._seen.get(name, 0) < self._steps() for name in self.task_names):
            return {}
        blocks = [torch.stack(ts) for ts in zip(*(self._task_blocks[name] for name in self.task_names))]
        self._task_blocks = {}
        losses = torch.stack([self._collected[name]["loss"] for name in self.task_names])
        return self._aggregate_checked(blocks, scale, losses, None)

    def step(self, skipped: bool | Tensor | None = None) -> dict[str, Tensor]:
        done, expected = self._seen.get("joint", 0), self._steps()
        if self._mode == JOINT and done not in (0, expected):
            self._reset()  # the counts are read before: the reset clears them
            raise RuntimeError(
                f"{type(self).__name__}: step() after {done} of {expected} backwards (accumulated); the update "
                "was dropped"
            )
        return super().step(skipped)

    def _finish(self) -> dict[str, Tensor]:
        return {}  # per-task mode solved in the last backward_task
