"""ScaledAdam's CPU kernel (scaled_adam_cpu.cpp), built with torch.utils.cpp_extension at first use
(mtl_bench/cpp_kernels.py)."""

from __future__ import annotations

from typing import Any

from mtl_bench import cpp_kernels

SOURCE = cpp_kernels.source("scaled_adam_cpu.cpp")
# -ffp-contract=off keeps a*b+c as two roundings, as the eager path computes it.
CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-ffp-contract=off"]


def kernel() -> tuple[Any, str]:
    """(the built module, "") or (None, one line saying why it cannot be built here); tried once per process."""
    return cpp_kernels.build("mtl_bench_scaled_adam_cpu", SOURCE, CFLAGS, "ScaledAdam")
