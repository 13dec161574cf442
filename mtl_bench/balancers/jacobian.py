"""Per-task gradients, their Gramian, and the base class of the gradient-combining methods.

The methods of this family (PCGrad, MGDA, IMTL, UPGrad, CAGrad, Aligned-MTL, Nash-MTL, GradVac) all end in
a shared direction d = Σ_i w_i g_i, a combination of the tasks' gradients g_i at the shared parameters (or
at the shared representation), with weights w computed from the T×T Gramian G = J Jᵀ of the Jacobian J whose
rows are the g_i. So one step here is:

1. `grad_source="shared_params"`: one backward per task through its head and the trunk (`task_jacobian`),
   each written into row i of J, one (T, *p.shape) block per shared parameter, as it arrives; also each
   head's own parameter gradient. Exact through every path, also where `shared` is not a cut (SegNet-MTAN:
   each task's attention modules read the shared features of every stage). This is the floor's work (T
   backwards); one batched vector-Jacobian product through the trunk (`param_jacobian`, under vmap) did the
   same arithmetic 1.1-1.3x slower on one CPU thread.
2. `grad_source="shared_rep"`: T gradients at `shared` (the trunk's output) through the heads, one small
   backward per task that stops at `shared` (`grads_at_shared`); J is those gradients, flattened (MGDA-UB).
   It assumes `shared` is a cut: every loss reaches the shared parameters only through `shared`. A walk over
   each loss's autograd graph (`task_params`) checks it at every step; where it fails, `shared_rep` (and
   GradDrop) cannot be exact and raise.
3. G = Σ_blocks J_b J_bᵀ (no concatenated copy of J; large float32 CPU blocks through a C++ kernel,
   gramian_cpu.cpp, about 3x faster than torch.mm on this shape: scripts/bench_gramian.py), unscaled (divided
   by the loss scale squared); under DDP averaged over the ranks, so every rank solves the same problem and gets
   the same weights.
4. The method turns G into weights (most on the CPU: T×T problems, see `host_gramian`).
5. d = Σ_i w_i g_i per block, and everything lands in `.grad` through ONE autograd call on the leaves
   (`write_leaf_grads`): it adds to existing gradients (per-task mode and gradient accumulation add up) and
   fires DDP's gradient hooks, so DDP all-reduces the direction as it would a plain backward. With
   `shared_rep` the direction at `shared` goes back through the trunk instead.

The heads' parameters get the gradient of Σ_i c_i L_i with c_i = 1 (the papers; LibMTL and torchjd do the
same) unless a method says otherwise (Nash-MTL: its weights; IMTL-L: the loss scales).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from mtl_bench import cpp_kernels, tags
from mtl_bench.balancers.base import Context
from mtl_bench.balancers.distributed import world_size
from mtl_bench.balancers.staged import JOINT, PER_TASK, StagedBalancer, scaled_grad

GRAD_SOURCES = ("shared_params", "shared_rep")

# The C++ Gramian kernel (gramian_cpu.cpp) takes float32 CPU blocks of at least KERNEL_MIN_NUMEL floats: below
# that a block's Gramian takes well under a millisecond either way, and a toy run never waits for the build.
KERNEL_MIN_NUMEL = 1 << 20
GRAMIAN_SOURCE = Path(__file__).with_name("gramian_cpu.cpp")
GRAMIAN_CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno"]


# ---------------------------------------------------------------------------------------------- the graph

NOT_A_CUT = (
    "the model's predictions depend on the shared parameters other than through the shared "
    "representation passed to backward (as SegNet-MTAN's attention modules, which read every encoder and "
    "decoder stage), so gradients taken at that representation miss those paths; the gradient methods take "
    "exact per-task gradients with grad_source=shared_params"
)


def task_params(loss: Tensor, shared: Tensor, shared_ids: set[int]) -> tuple[list[Tensor], bool]:
    """The leaves `loss` depends on that are not shared parameters (the task's own: its head, attention
    modules, ...), and whether `shared` is a cut: whether the loss reaches the shared parameters only through it.

    A walk over the autograd graph from the loss that stops at `shared` (as torchjd's `mtl_backward` finds
    task parameters): a shared parameter reached this way is read other than through `shared`.
    """
    stop = shared.grad_fn
    found: list[Tensor] = []
    cut = True
    seen: set = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node is stop or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf
        if variable is not None:
            if variable is shared:
                continue
            if id(variable) in shared_ids:
                cut = False
            else:
                found.append(variable)
            continue
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found, cut


def upstream_leaves(tensor: Tensor) -> set[int]:
    """The ids of the leaves `tensor` depends on (the trunk's parameters when `tensor` is its output)."""
    found: set[int] = set()
    seen: set = set()
    stack = [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf
        if variable is not None:
            found.add(id(variable))
            continue
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def head_params(loss: Tensor, shared: Tensor, shared_ids: set[int]) -> list[Tensor]:
    """The task's own parameters (`task_params`) for a method that needs `shared` to be a cut: a ValueError
    when the loss reads a shared parameter other than through `shared` (its gradients there would be incomplete)."""
    params, cut = task_params(loss, shared, shared_ids)
    if not cut:
        raise ValueError(f"shared: {NOT_A_CUT}")
    return params


def grads_at_shared(
    losses: Sequence[Tensor],
    shared: Tensor,
    scale: Optional[Tensor],
    shared_ids: set[int],
    params: Optional[Sequence[list[Tensor]]] = None,
) -> tuple[Tensor, list[list[tuple[Tensor, Tensor]]]]:
    """Each loss's gradient at `shared` (stacked, (T, *shared.shape)) and at its head's parameters.

    One backward per task, through that task's head only (the trunk graph is kept for the batched product).
    Gradients are of `scale * loss`, like the real backward (fp16 heads would underflow otherwise).
    `params`: each loss's head parameters when already found (`task_params`, with `shared` a cut).
    """
    rows, heads = [], []
    for i, loss in enumerate(losses):
        task = head_params(loss, shared, shared_ids) if params is None else params[i]
        grads = scaled_grad(loss, [shared, *task], scale, retain_graph=True, allow_unused=True)
        rows.append(grads[0] if grads[0] is not None else torch.zeros_like(shared))
        heads.append([(p, g) for p, g in zip(task, grads[1:]) if g is not None])
    return torch.stack(rows), heads


def task_jacobian(
    losses: Sequence[Tensor],
    shared: Tensor,
    params: Sequence[Tensor],
    scale: Optional[Tensor],
    shared_ids: set[int],
    reuse: Optional[Sequence[Tensor]] = None,
) -> tuple[list[Tensor], list[list[tuple[Tensor, Tensor]]]]:
    """J at the shared parameters `params` (one (T, *p.shape) block each) and each task's gradients at its own
    parameters, exact through every path (whether or not `shared` is a cut). Frees the graph.

    One backward per task through its head and the trunk (`autograd.grad(loss_i, [*params, *own_i])`), each
    written into row i of the blocks as it arrives: the floor's work (T backwards), with one copy of each
    gradient. On one CPU thread this is faster than one batched product through the trunk (vmap's batched
    ReLU backward and layout copies cost 1.1-1.3x the T plain backwards at T=2-10; docs/benchmarks.md).
    `reuse`: last step's blocks, written over when their shapes and layouts fit (a fresh T×P buffer costs its
    page faults on every step: 30 ms against 4 ms for 37 MB on one CPU thread).
    """
    t = len(losses)
    blocks: list[Tensor] = []
    heads = []
    for i, (grads, own) in enumerate(task_gradients(losses, shared, params, scale, shared_ids)):
        if not blocks:  # rows laid out as autograd returns them (a Linear's weight gradient is transposed)
            refs = [g if g is not None else p for p, g in zip(params, grads)]
            fits = reuse is not None and len(reuse) == len(refs) and all(_fits(b, r, t) for b, r in zip(reuse, refs))
            blocks = list(reuse) if fits and reuse is not None else [rows_like(r, t) for r in refs]
        for block, g in zip(blocks, grads):
            block[i].copy_(g) if g is not None else block[i].zero_()
        heads.append(own)
    return blocks, heads


def task_gradients(
    losses: Sequence[Tensor], shared: Tensor, params: Sequence[Tensor], scale: Optional[Tensor], shared_ids: set[int]
) -> Iterator[tuple[list[Optional[Tensor]], list[tuple[Tensor, Tensor]]]]:
    """Task by task, as its backward returns them: its gradients at `params` (None where it does not reach one) and
    (parameter, gradient) at its own parameters. One backward per task through its head and the trunk; the graph is
    freed by the last one."""
    t = len(losses)
    found = [task_params(loss, shared, shared_ids)[0] for loss in losses]  # before a backward frees a graph
    for i, (loss, own) in enumerate(zip(losses, found)):
        grads = scaled_grad(loss, [*params, *own], scale, retain_graph=i < t - 1, allow_unused=True)
        yield list(grads[: len(params)]), [(p, g) for p, g in zip(own, grads[len(params) :]) if g is not None]


def pieces_norm(pieces: Sequence[Tensor]) -> Tensor:
    """The norm of a gradient given as pieces (one per parameter): ‖(‖g_1‖, ..., ‖g_K‖)‖."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(pieces))))


def float_task_rows(
    losses: Sequence[Tensor],
    shared: Tensor,
    params: Sequence[Tensor],
    scale: Optional[Tensor],
    shared_ids: set[int],
    heads: list[tuple[Tensor, Tensor]],
) -> Iterator[list[Tensor]]:
    """`task_gradients` for a method that works on each task's gradient as it arrives, without a Jacobian: task by
    task, its gradients at `params` as float32 (zeros where it does not reach one); its own parameters' (parameter,
    gradient) pairs are added to `heads`."""
    for grads, own in task_gradients(losses, shared, params, scale, shared_ids):
        heads += own
        yield [g.float() if g is not None else torch.zeros_like(p, dtype=torch.float32) for g, p in zip(grads, params)]


def param_jacobian(shared: Tensor, params: Sequence[Tensor], rows: Tensor) -> list[Tensor]:
    """J as one (T, *p.shape) block per parameter: ONE batched vector-Jacobian product through the trunk.

    Frees the trunk's graph. A parameter the trunk does not use gets a zero block.
    """
    blocks = torch.autograd.grad(shared, list(params), grad_outputs=rows, is_grads_batched=True, allow_unused=True)
    return [
        b if b is not None else rows.new_zeros((rows.shape[0], *p.shape), dtype=p.dtype) for b, p in zip(blocks, params)
    ]


def _memory_order(t: Tensor, first: int = 0) -> list[int]:
    """The dimensions of `t` from `first` on, outermost in memory first."""
    strides = t.stride()
    return sorted(range(first, t.dim()), key=lambda d: -strides[d])


def rows_like(grad: Tensor, t: int) -> Tensor:
    """An empty (t, *grad.shape) block whose every row has `grad`'s memory layout, so that copying a gradient
    into a row is a straight copy (not a transposing one) and `flat_rows` is a view."""
    order = _memory_order(grad)
    buf = grad.new_empty((t, *(grad.shape[d] for d in order)))
    return buf.permute(0, *(order.index(d) + 1 for d in range(grad.dim())))


def _fits(block: Tensor, grad: Tensor, t: int) -> bool:
    """Whether `block` has `t` rows of `grad`'s shape, dtype, device and layout."""
    row = block[0]
    same = row.shape == grad.shape and row.dtype == grad.dtype and row.device == grad.device
    return same and block.shape[0] == t and row.stride() == grad.stride()


def flat_rows(block: Tensor) -> Tensor:
    """A (T, *shape) block as (T, P), each row flattened in memory order: a view when the rows are dense
    (`rows_like`); the same order for every row, which is all a Gramian or a combination needs."""
    return block.permute(0, *_memory_order(block, 1)).reshape(block.shape[0], -1)


def unflatten_row(flat: Tensor, block: Tensor) -> Tensor:
    """The inverse of `flat_rows` for one row: `flat` (P,) back to block.shape[1:], in the rows' layout."""
    order = [d - 1 for d in _memory_order(block, 1)]
    return flat.view([block.shape[d + 1] for d in order]).permute(*(order.index(d) for d in range(len(order))))


def gramian(blocks: Sequence[Tensor]) -> Tensor:
    """G = J Jᵀ (float32) summed over the blocks of J, without concatenating them."""
    total: Optional[Tensor] = None
    for block in blocks:
        g = block_gramian(flat_rows(block))
        total = g if total is None else total + g
    assert total is not None
    return total


def takes_kernel(param: Tensor, tasks: int) -> bool:
    """Whether the (tasks, *param.shape) gradient block of `param` goes through the Gramian kernel."""
    return param.device.type == "cpu" and param.dtype == torch.float32 and param.numel() * tasks >= KERNEL_MIN_NUMEL


def block_gramian(m: Tensor) -> Tensor:
    """m mᵀ in float32 for one (T, P) block: the C++ kernel for large float32 CPU blocks (about 3x torch.mm on one
    thread: gramian_cpu.cpp), torch.mm otherwise."""
    if m.stride(1) == 1 and takes_kernel(m[0], m.shape[0]):
        module = gramian_kernel()
        if module is not None:
            return module.gramian(m)
    if m.dtype != torch.float32:
        m = m.float()
    return m @ m.T


def gramian_kernel() -> Any:
    """The built Gramian kernel, or None (said once) where it cannot be built: torch.mm computes the same."""
    return cpp_kernels.build_or_say(
        "mtl_bench_gramian_cpu",
        GRAMIAN_SOURCE,
        GRAMIAN_CFLAGS,
        "gradient methods' Gramian",
        "gradient methods: the C++ Gramian kernel cannot be built here ({error}); torch.mm computes it",
    )


def combine(blocks: Sequence[Tensor], weights: Tensor) -> list[Tensor]:
    """Σ_i w_i J_i per block: `weights` (T,) or one row of weights per block (K, T)."""
    out = []
    for k, block in enumerate(blocks):
        w = weights if weights.dim() == 1 else weights[k]
        m = flat_rows(block)
        out.append(unflatten_row(w.to(m.dtype) @ m, block))
    return out


def rank_mean(value: Tensor) -> Tensor:
    """The mean over DDP ranks (every rank gets the same bits); unchanged on one process."""
    n = world_size()
    if n == 1:
        return value
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / n


def host_gramian(gram: Tensor) -> Optional[np.ndarray]:
    """G as float64 numpy for a CPU solver, or None when it is not finite (a skipped step: NaN weights).

    On a GPU this is the step's one device-to-host copy (a sync): small iterative solvers with
    data-dependent branches (Frank-Wolfe, active sets, SLSQP, cvxpy) run far faster on the host than as
    hundreds of tiny kernels.
    """
    g = gram.detach().to("cpu", torch.float64).numpy()
    return g if np.isfinite(g).all() else None


def to_device(values: np.ndarray | Sequence[float], like: Tensor) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float32)).to(like.device)


def gram_metrics(gram: Tensor, names: Sequence[str]) -> dict[str, Tensor]:
    """`grad_norm/<task>` and `grad_cos/<a>/<b>` for every pair, from the (unscaled) Gramian."""
    norms = gram.diagonal().clamp_min(0).sqrt()
    cos = gram / (norms[:, None] * norms[None, :]).clamp_min(1e-30)
    metrics = {tags.grad_norm(n): v for n, v in zip(names, norms.unbind())}
    t = len(names)
    if t > 1:
        i, j = torch.triu_indices(t, t, 1, device=gram.device).unbind()  # row-major, as combinations()
        for (a, b), v in zip(itertools.combinations(range(t), 2), cos[i, j].unbind()):
            metrics[tags.grad_cos(names[a], names[b])] = v
    return metrics


class _HandOver(torch.autograd.Function):
    """A scalar whose backward returns, once, the gradients it was given for its inputs (the leaves)."""

    @staticmethod
    def forward(ctx: Any, box: list[list[Tensor]], *leaves: Tensor) -> Tensor:
        ctx.box = box
        return leaves[0].new_zeros(())

    @staticmethod
    def backward(ctx: Any, *_: Tensor) -> tuple[Optional[Tensor], ...]:
        grads, ctx.box = ctx.box.pop(), None
        return (None, *grads)


def leaf_grads_root(pairs: list[tuple[Tensor, Tensor]]) -> Tensor:
    """A scalar root whose backward adds each gradient of `pairs` to its leaf's `.grad`, as a plain backward would.

    `pairs` is emptied: its gradients are handed over, and autograd keeps each one as the leaf's `.grad`
    without a copy where the leaf has none and nothing else holds the gradient (a gradient handed to
    `autograd.backward` for a leaf is copied, since the caller still holds it: 25 µs for a 100 x 512 weight).
    So the gradients must be tensors made for this call, not views of tensors kept past it. The leaves'
    hooks and DDP's reducer see an ordinary backward.
    """
    leaves = [p for p, _ in pairs]
    box = [[g.to(p.dtype) for p, g in pairs]]
    pairs.clear()
    with torch.enable_grad():
        return _HandOver.apply(box, *leaves)


def write_leaf_grads(pairs: list[tuple[Tensor, Tensor]]) -> None:
    """Add each gradient to its leaf's `.grad` in one autograd call (DDP's gradient hooks fire); `pairs` is
    emptied (`leaf_grads_root`)."""
    if pairs:
        leaf_grads_root(pairs).backward()


# ---------------------------------------------------------------------------------------------- base class


@dataclass
class Solution:
    """What a method's solve returns: the shared direction's weights (on the device, (T,) or one row per
    block (K, T)), the heads' weights (None: 1 each) and the method's own measurements."""

    weights: Tensor
    head_weights: Optional[Tensor] = None
    metrics: dict[str, Tensor] = field(default_factory=dict)


class GradientBalancer(StagedBalancer):
    """Base of the methods that combine per-task gradients; a method implements `_solve(gram, losses)`.

    `grad_source`: "shared_params" (the exact per-task gradients at the model's shared parameters; LibMTL's
    rep_grad=False, torchjd's mtl_backward) or "shared_rep" (the gradients at the shared representation
    passed to backward, flattened over the batch: MGDA-UB; cheap: no per-task trunk backward), where the
    method allows it (`SOURCES`). shared_rep needs every prediction to read the shared parameters only through
    that representation (a ValueError at the first backward otherwise, e.g. on SegNet-MTAN); shared_params is
    exact either way (see the module docstring).

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

    SOURCES: tuple[str, ...] = ("shared_params",)
    HEADS_FROM_SOLUTION = False  # True: the heads' weights come from the solve (they must wait for it)
    BLOCK_GRAMIANS = False  # True: `_solve` also gets one Gramian per block (shared parameter): `self._block_grams`
    SOLVE_READS_GRAMIAN = True  # False: `_weigh(losses)` instead of `_solve`, and no Gramian unless measuring

    _params: list[Tensor]  # set through __dict__ in __init__ (not registered with the module)

    def __init__(self, task_names: Sequence[str], shared_params: Optional[Iterable[Tensor]], grad_source: str) -> None:
        super().__init__(task_names)
        if grad_source not in GRAD_SOURCES:
            raise ValueError(f"grad_source: {grad_source!r} is not one of {', '.join(GRAD_SOURCES)}")
        if grad_source not in self.SOURCES:
            raise ValueError(
                f"grad_source: {grad_source} not supported by {type(self).__name__} "
                f"(allowed: {', '.join(self.SOURCES)})"
            )
        self.grad_source = grad_source
        params = [p for p in (shared_params or []) if p.requires_grad]
        if grad_source == "shared_params" and not params:
            raise ValueError("shared_params: grad_source=shared_params needs the model's shared parameters")
        self.__dict__["_params"] = params  # the model's: kept out of this module's registry and state_dict
        self._param_ids = {id(p) for p in params}
        self._spare: Optional[list[Tensor]] = None  # last step's Jacobian blocks, rewritten by the next step
        self._clear_step()
        if grad_source == "shared_params" and any(takes_kernel(p, len(self.task_names)) for p in params):
            gramian_kernel()  # built now, with the run's other parts, rather than inside its first timed step

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
        """Weights from the unscaled, rank-averaged Gramian (T, T) and the step's mean losses (T,)."""
        raise NotImplementedError

    @staticmethod
    def _unscaled_gramian(blocks: Sequence[Tensor], scale: Optional[Tensor]) -> Tensor:
        """G of the unscaled gradients (the blocks hold the scaled ones), averaged over the ranks."""
        gram = gramian(blocks)
        return rank_mean(gram / (scale * scale) if scale is not None else gram)

    def _weigh(self, losses: Tensor) -> Solution:
        """Weights of a method that does not read the Gramian (`SOLVE_READS_GRAMIAN = False`): it is then computed
        only for the measurements of a step that reads them."""
        raise NotImplementedError

    def _transform_losses(self, losses: list[Tensor]) -> list[Tensor]:
        """The losses the gradients are taken of (IMTL-L scales them); the identity by default."""
        return losses

    # ------------------------------------------------------------------ the step

    def _steps(self) -> int:
        return self._ctx.accumulation_steps if self._ctx is not None else 1

    def _heads(
        self, heads: list[list[tuple[Tensor, Tensor]]], indices: Sequence[int], weights: Optional[Tensor]
    ) -> list[tuple[Tensor, Tensor]]:
        """Head gradients to write now: weighted by `weights` (None: 1), or held for the solve."""
        pairs = []
        for i, task_heads in zip(indices, heads):
            for p, g in task_heads:
                if self.HEADS_FROM_SOLUTION and weights is None:
                    self._held.append((i, p, g))
                else:
                    pairs.append((p, g if weights is None else g * weights[i].to(g.dtype)))
        return pairs

    def _finish_solve(
        self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor, shared: Optional[Tensor]
    ) -> dict[str, Tensor]:
        """Solve on the summed Jacobian, write d (and any held heads); return the step's measurements."""
        gram: Optional[Tensor] = None
        if self.BLOCK_GRAMIANS:
            grams = torch.stack([gramian([block]) for block in blocks])
            grams = rank_mean(grams / (scale * scale) if scale is not None else grams)
            self._block_grams = grams
            gram = grams.sum(0)
        elif self.SOLVE_READS_GRAMIAN or self.measuring:
            gram = self._unscaled_gramian(blocks, scale)
        losses = rank_mean(losses)
        self._require_finite(*([gram] if gram is not None else []), losses)
        solution = self._solve(gram, losses) if self.SOLVE_READS_GRAMIAN and gram is not None else self._weigh(losses)
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
        weights = solution.weights if solution.weights.dim() == 1 else solution.weights.mean(0)
        metrics = {tags.weight(n): v for n, v in zip(self.task_names, weights.unbind())}
        if gram is not None and self.measuring:
            metrics.update(gram_metrics(gram, self.task_names))
        metrics.update(solution.metrics)
        return metrics

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        self.check_losses(losses)
        scale = self._begin(JOINT, ctx, shared)
        ordered = self._transform_losses([losses[name] for name in self.task_names])
        loss_values = torch.stack([loss.detach().float() for loss in ordered])
        head_w = self._known_head_weights()
        if self.grad_source == "shared_rep":
            found = [task_params(loss, shared, self._param_ids) for loss in ordered]
            if not all(cut for _, cut in found):
                raise ValueError(f"grad_source: shared_rep: {NOT_A_CUT}")
            rows, heads = grads_at_shared(ordered, shared, scale, self._param_ids, [p for p, _ in found])
            pairs = self._heads(heads, range(len(ordered)), head_w)
            write_leaf_grads(pairs) if pairs else None
            metrics = self._finish_solve([rows], scale, self._mean("losses", loss_values), shared)
            self._end_joint()
            return metrics
        spare = self._spare if self._blocks is None else None  # never the accumulator of this step's micro-batches
        self._spare = None  # while the blocks are in use
        blocks, heads = task_jacobian(ordered, shared, self._params, scale, self._param_ids, spare)
        write_leaf_grads(self._heads(heads, range(len(ordered)), head_w))
        self._add_blocks(blocks)
        self._losses_sum = loss_values if self._losses_sum is None else self._losses_sum + loss_values
        self._seen["joint"] = self._seen.get("joint", 0) + 1
        if self._seen["joint"] < self._steps():
            return {}
        assert self._blocks is not None  # set by _add_blocks above
        metrics = self._finish_solve(self._blocks, scale, self._losses_sum / self._seen["joint"], None)
        self._spare, self._blocks = self._blocks, None  # no method keeps them past its solve
        self._end_joint()
        return metrics

    def _add_blocks(self, blocks: list[Tensor]) -> None:
        if self._blocks is None:
            self._blocks = blocks
        else:
            torch._foreach_add_(self._blocks, blocks)

    def _known_head_weights(self) -> Optional[Tensor]:
        """The heads' weights before the solve (IMTL-L's scales); None: 1 each, or wait for the solve."""
        return None

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
        (loss,) = self._transform_losses_one(i, loss)
        params, _ = task_params(loss, shared, self._param_ids)  # exact whether or not `shared` is a cut
        grads = scaled_grad(loss, [*self._params, *params], scale, allow_unused=True)
        shared_grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, self._params)]
        head = [(p, g) for p, g in zip(params, grads[len(self._params) :]) if g is not None]
        write_leaf_grads(self._heads([head], [i], self._known_head_weights()))
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
        return self._finish_solve(blocks, scale, losses, None)

    def _transform_losses_one(self, index: int, loss: Tensor) -> list[Tensor]:
        return [loss]

    def step(self, skipped: bool | Tensor | None = None) -> dict[str, Tensor]:
        pending_joint = self._mode == JOINT and self._seen.get("joint", 0) not in (0, self._steps())
        if pending_joint:
            self._reset()
            raise RuntimeError(
                f"{type(self).__name__}: step() after {self._seen.get('joint')} of "
                f"{self._steps()} accumulated backwards; the update was dropped"
            )
        return super().step(skipped)

    def _finish(self) -> dict[str, Tensor]:
        return {}  # per-task mode solved in the last backward_task


def nan_weights(t: int, like: Tensor) -> Tensor:
    return torch.full((t,), math.nan, device=like.device)


def host_solution(gram: Tensor, metric: str, solve: Callable[[np.ndarray], tuple[np.ndarray, float]]) -> Solution:
    """The weights of a host solver, `solve(G) -> (weights, value)` on G as float64 numpy, and `metric` = value;
    NaN weights and a NaN `metric` when G is not finite (a skipped step)."""
    g = host_gramian(gram)
    if g is None:
        return Solution(
            nan_weights(gram.shape[0], gram), metrics={metric: torch.full((), math.nan, device=gram.device)}
        )
    weights, value = solve(g)
    return Solution(to_device(weights, gram), metrics={metric: torch.tensor(float(value), device=gram.device)})
