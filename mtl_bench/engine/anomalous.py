"""Trainable parameters that do not reach the loss (mmcv OptimizerHook's detect_anomalous_params)."""

from __future__ import annotations

from typing import Iterable

from torch import Tensor, nn


def parameters_outside_graph(losses: Iterable[Tensor], named_params: Iterable[tuple[str, nn.Parameter]]) -> list[str]:
    """Names of trainable parameters that no loss's autograd graph reaches (unused in forward, or cut off)."""
    seen_nodes, reached = set(), set()
    stack = [loss.grad_fn for loss in losses if loss.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen_nodes:
            continue
        seen_nodes.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad nodes hold the leaf tensor
        if variable is not None:
            reached.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)
    return [name for name, p in named_params if p.requires_grad and id(p) not in reached]
