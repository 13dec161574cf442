"""J by one batched vector-Jacobian product through the trunk: the tests' independent way to the Jacobian that
mtl_bench.gradient_engine.task_grads builds one backward per task."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def param_jacobian(shared: Tensor, params: Sequence[Tensor], rows: Tensor) -> list[Tensor]:
    """J as one (T, *p.shape) block per parameter: ONE batched vector-Jacobian product through the trunk.

    Frees the trunk's graph. A parameter the trunk does not use gets a zero block.
    """
    blocks = torch.autograd.grad(shared, list(params), grad_outputs=rows, is_grads_batched=True, allow_unused=True)
    return [
        b if b is not None else rows.new_zeros((rows.shape[0], *p.shape), dtype=p.dtype) for b, p in zip(blocks, params)
    ]
