"""ScaledAdam's CPU kernel (scaled_adam_cpu.cpp), built with torch.utils.cpp_extension at first use.

The build is cached by torch (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions) and rebuilt when the
source or the flags change. It needs a C++ compiler and ninja, as torch.compile's CPU backend needs a compiler.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("mtl_bench")

SOURCE = Path(__file__).with_name("scaled_adam_cpu.cpp")
# Portable flags: the source picks AVX-512 / AVX2 / baseline code at load time (target_clones). -ffp-contract=off
# keeps a*b+c as two roundings, as the eager path computes it.
CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-ffp-contract=off"]

_kernel: Any = None
_error = ""


def kernel() -> tuple[Any, str]:
    """(the built module, "") or (None, one line saying why it cannot be built here); tried once per process."""
    global _kernel, _error
    if _kernel is None and not _error:
        try:
            from torch.utils.cpp_extension import load

            log.info("ScaledAdam: building the CPU kernel (once; cached by torch.utils.cpp_extension)")
            _kernel = load(
                name="mtl_bench_scaled_adam_cpu",
                sources=[str(SOURCE)],
                extra_cflags=CFLAGS,
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
        except Exception as err:  # no compiler, no ninja, a failed build: reported by the caller
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            _error = f"{type(err).__name__}: {lines[-1] if lines else 'no message'}"[:300]
    return _kernel, _error
