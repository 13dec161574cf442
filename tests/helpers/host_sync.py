"""The no-host-sync guard: on the CPU, catch what would make a CUDA step wait for the device.

Two layers, because CUDA syncs come from two places:
- Python-level conversions of a tensor to a host value (`.item()`, `.tolist()`, `float()`, `int()`, `bool()`,
  `.numpy()`, `.cpu()`), patched on `torch.Tensor`;
- ATen ops that read device memory to decide a shape or raise an error, seen by a TorchDispatchMode:
  `_local_scalar_dense` (every scalar read, also from C++), `nonzero` / `torch.where(cond)`, `masked_select`,
  boolean-mask indexing (`x[mask]`, `x[mask] = v`), `unique`, `equal`, and the linalg error check
  (`_linalg_check_errors`: `torch.linalg.solve`, `cholesky`, `inv` raise on a singular input only after reading
  `info` on the host; their `_ex` forms do not).

`no_host_sync()` raises at the first one (but a balancer's named host solve, `host_solve_of=`); `host_syncs()`
records them (what, and where in mtl_bench) for a test to judge with `allowed`.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

PACKAGE = Path(__file__).resolve().parents[2] / "mtl_bench"
TESTS = Path(__file__).resolve().parents[1]
CONVERSIONS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "cpu")
aten = torch.ops.aten
SYNC_OPS = {
    aten._local_scalar_dense.default: "a scalar read",
    aten.nonzero.default: "nonzero (an output shape read from the device)",
    aten.masked_select.default: "masked_select (an output shape read from the device)",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.equal.default: "torch.equal",
    aten._linalg_check_errors.default: "a linalg error check (use the _ex form)",
}


@dataclass(frozen=True)
class Sync:
    what: str
    where: str  # "file.py:line in function" of the innermost frame in mtl_bench (else in the tests)
    within: tuple[str, ...]  # the qualified names of the mtl_bench functions on the stack, innermost first

    def __str__(self) -> str:
        return f"{self.what} at {self.where}"


def _stack() -> tuple[str, tuple[str, ...]]:
    frames = [f for f in inspect.stack(context=0) if Path(f.filename).name != "host_sync.py"]  # innermost first
    ours = [f for f in frames if Path(f.filename).is_relative_to(PACKAGE)]
    within = tuple(f.frame.f_code.co_qualname for f in ours)
    for frame in ours or [f for f in frames if Path(f.filename).is_relative_to(TESTS)]:
        path = Path(frame.filename)
        root = PACKAGE if path.is_relative_to(PACKAGE) else TESTS
        return f"{path.relative_to(root.parent)}:{frame.lineno} in {frame.function}", within
    return "outside mtl_bench", within


def allowed(sync: Sync, method: Any = None) -> bool:
    """Whether `sync` is one a GPU never has (a read through `cpu_value`, which refuses any other device) or,
    for a balancer `method` that names a host solve (`HOST_SOLVE`), happens inside it (`HOST_SOLVE_IN`)."""
    if "cpu_value" in sync.within:
        return True
    cls = method if isinstance(method, type) or method is None else type(method)
    if cls is None or not getattr(method, "HOST_SOLVE", ""):  # an instance's: GramianBalancer's is its weighting's
        return False
    inside = {f"{k.__name__}.{cls.HOST_SOLVE_IN}" for k in cls.__mro__}
    return any(q in inside for q in sync.within)


def _bool_index(indices: Any) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


class _Watch(TorchDispatchMode):
    def __init__(self, found: list[Sync], raising: bool, method: Any = None) -> None:
        super().__init__()
        self.found, self.raising, self.method, self.quiet = found, raising, method, 0

    def note(self, what: str) -> None:
        if self.quiet:  # inside a patched conversion, already noted
            return
        sync = Sync(what, *_stack())
        if self.raising and not allowed(sync, self.method):
            raise AssertionError(f"host sync in the hot path: {sync}")
        self.found.append(sync)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNC_OPS:
            self.note(SYNC_OPS[func])
        elif func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default) and _bool_index(args[1]):
            self.note(f"{func.__name__} with a boolean mask (nonzero inside)")
        return func(*args, **kwargs)


@contextlib.contextmanager
def _watching(raising: bool, method: Any = None) -> Iterator[list[Sync]]:
    found: list[Sync] = []
    watch = _Watch(found, raising, method)
    originals = {name: getattr(torch.Tensor, name) for name in CONVERSIONS}

    def patched(name: str):
        original = originals[name]

        def conversion(self, *args, **kwargs):
            watch.note(f"Tensor.{name}")
            watch.quiet += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                watch.quiet -= 1

        return conversion

    with pytest.MonkeyPatch.context() as m:
        for name in CONVERSIONS:
            m.setattr(torch.Tensor, name, patched(name))
        with watch:
            yield found


@contextlib.contextmanager
def no_host_sync(monkeypatch: pytest.MonkeyPatch | None = None, *, host_solve_of: Any = None) -> Iterator[None]:
    """Inside the block any host sync (as a CUDA device would have one) raises AssertionError naming it and where,
    except those `allowed` for the balancer `host_solve_of` (its named host solve). (`monkeypatch` is accepted
    for the callers written before the guard patched on its own.)"""
    with _watching(raising=True, method=host_solve_of):
        yield


@contextlib.contextmanager
def host_syncs() -> Iterator[list[Sync]]:
    """Records every host sync inside the block, in order."""
    with _watching(raising=False) as found:
        yield found
