"""Per-task gradients: one backward per task, at the shared representation or at the shared parameters (the
rows of the Jacobian J), and each task's gradients at its own parameters."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.gradient_engine.blocks import has_rows_like, rows_like
from mtl_bench.gradient_engine.graph import head_params, task_params
from mtl_bench.gradient_engine.staged import scaled_grad


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
            fits = (
                reuse is not None
                and len(reuse) == len(refs)
                and all(has_rows_like(b, r, t) for b, r in zip(reuse, refs))
            )
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
