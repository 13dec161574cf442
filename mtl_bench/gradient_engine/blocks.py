"""J's memory layout: one (T, *p.shape) block per shared parameter, each row laid out as autograd returns that
parameter's gradient, seen flat as (T, P) without a copy; and the combination Σ_i w_i J_i per block."""

from __future__ import annotations

from typing import Sequence

from torch import Tensor


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


def has_rows_like(block: Tensor, grad: Tensor, t: int) -> bool:
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


def combine(blocks: Sequence[Tensor], weights: Tensor) -> list[Tensor]:
    """Σ_i w_i J_i per block: `weights` (T,) or one row of weights per block (K, T)."""
    out = []
    for k, block in enumerate(blocks):
        w = weights if weights.dim() == 1 else weights[k]
        m = flat_rows(block)
        out.append(unflatten_row(w.to(m.dtype) @ m, block))
    return out
