"""C++ CPU kernels built with torch.utils.cpp_extension at first use. The sources sit in mtl_bench/cpp/ (its
README says what each does, when it is built, and what happens without a compiler, on ARM and on a GPU):
ScaledAdam's update (scaled_adam_cpu.cpp), the gradient methods' Gramian (gramian_cpu.cpp), TrimmedMean's trim=1
direction (trimmed_mean_cpu.cpp) and ExcessMTL's excess risks (excess_mtl_cpu.cpp).

A build is cached by torch (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions) and rebuilt when the
source or the flags change. It needs a C++ compiler and ninja, as torch.compile's CPU backend needs a compiler.
On x86-64 the sources pick AVX-512 / AVX2 / baseline code at load time (target_clones), so the flags stay portable.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger("mtl_bench")

SOURCES = Path(__file__).resolve().with_name("cpp")

_built: dict[str, Any] = {}
_errors: dict[str, str] = {}
_said: set[str] = set()  # kernels whose missing build was said


def source(filename: str) -> Path:
    """The path of a kernel's source in mtl_bench/cpp/."""
    return SOURCES / filename


def build(name: str, source: Path, cflags: Sequence[str], what: str) -> tuple[Any, str]:
    """(the built module, "") or (None, one line saying why it cannot be built here); tried once per process."""
    if name not in _built and name not in _errors:
        try:
            from torch.utils.cpp_extension import load

            log.info("%s: loading the C++ CPU kernel (built the first time, then cached)", what)
            _built[name] = load(
                name=name, sources=[str(source)], extra_cflags=list(cflags), extra_ldflags=["-fopenmp"], verbose=False
            )
        except Exception as err:  # no compiler, no ninja, a failed build: reported by the caller
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            _errors[name] = f"{type(err).__name__}: {lines[-1] if lines else 'no message'}"[:300]
    return _built.get(name), _errors.get(name, "")


def build_or_say(name: str, source: Path, cflags: Sequence[str], what: str, missing: str) -> Any:
    """The built module, or None where it cannot be built: then `missing` (a line with an `{error}` field that says
    what computes the same instead) is logged once per process. For kernels that only make a path faster."""
    module, error = build(name, source, cflags, what)
    if module is None and name not in _said:
        _said.add(name)
        log.warning(missing.format(error=error))
    return module
