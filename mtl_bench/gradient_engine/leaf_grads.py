"""Writing gradients into `.grad` through one autograd call, so leaves' hooks and DDP's reducer see an ordinary
backward."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from mtl_bench.errors import ContractError


class GradientShapeError(ContractError):
    """A gradient written for a leaf of another shape (an aggregator's bug); the balancer names itself in front."""


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
    for p, g in pairs:  # metadata only: no read of the device
        if g.shape != p.shape:
            raise GradientShapeError(f"a gradient of shape {tuple(g.shape)} for a parameter of shape {tuple(p.shape)}")
    box = [[g.to(p.dtype) for p, g in pairs]]
    pairs.clear()
    with torch.enable_grad():
        return _HandOver.apply(box, *leaves)


def write_leaf_grads(pairs: list[tuple[Tensor, Tensor]]) -> None:
    """Add each gradient to its leaf's `.grad` in one autograd call (DDP's gradient hooks fire); `pairs` is
    emptied (`leaf_grads_root`)."""
    if pairs:
        leaf_grads_root(pairs).backward()
