"""Trainable parameters that do not reach the loss (mmcv OptimizerHook's detect_anomalous_params)."""

from __future__ import annotations

import logging
from typing import Iterable

from torch import Tensor, nn

log = logging.getLogger("mtl_bench")


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


def report_parameters_outside_graph(losses: Iterable[Tensor], model: nn.Module) -> None:
    """trainer.detect_anomalous_params: the run's log names them once (the first step's losses), or says none."""
    unused = parameters_outside_graph(losses, model.named_parameters())
    if unused:
        log.warning("trainable parameters that do not reach the loss: %s", ", ".join(unused))
    else:
        log.info("detect_anomalous_params: every trainable parameter reaches the loss")
