"""Walks over a loss's autograd graph: the leaves it reads, and whether the shared representation is a cut."""

from __future__ import annotations

from torch import Tensor

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
