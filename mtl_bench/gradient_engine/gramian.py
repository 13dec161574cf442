"""The Gramian G = J Jᵀ summed over J's blocks (large float32 CPU blocks through a C++ kernel, gramian_cpu.cpp,
about 3x faster than torch.mm on this shape: scripts/bench_gramian.py), and what it measures (norms, cosines)."""

from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import cpp_kernels, tags
from mtl_bench.gradient_engine.blocks import flat_rows

# The C++ Gramian kernel (gramian_cpu.cpp) takes float32 CPU blocks of at least KERNEL_MIN_NUMEL floats: below
# that a block's Gramian takes well under a millisecond either way, and a toy run never waits for the build.
KERNEL_MIN_NUMEL = 1 << 20
GRAMIAN_SOURCE = cpp_kernels.source("gramian_cpu.cpp")
GRAMIAN_CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno"]


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


def build_kernel_for(params: Sequence[Tensor], tasks: int) -> None:
    """Build the kernel now when some parameter's block will take it: with the run's other parts, rather than inside
    its first timed step."""
    if any(takes_kernel(p, tasks) for p in params):
        gramian_kernel()


def gramian_kernel() -> Any:
    """The built Gramian kernel, or None (said once) where it cannot be built: torch.mm computes the same."""
    return cpp_kernels.build_or_say(
        "mtl_bench_gramian_cpu",
        GRAMIAN_SOURCE,
        GRAMIAN_CFLAGS,
        "gradient methods' Gramian",
        "gradient methods: the C++ Gramian kernel cannot be built here ({error}); torch.mm computes it",
    )


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
