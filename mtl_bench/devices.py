"""Reads of a tensor's value on the host where a code path runs on the CPU only.

On a GPU a read of a device tensor (`.item()`, `bool()`, `.cpu()`) waits for every queued kernel: the hot
path never does one (tests/helpers/host_sync.py checks this on the CPU). A path that only CPU tensors take
(a C++ CPU kernel, a CPU buffer swap) may read values freely; it says so by reading through `cpu_value`,
which refuses a tensor on any other device instead of silently syncing it.
"""

from __future__ import annotations

from torch import Tensor


def cpu_value(t: Tensor) -> float | int | bool:
    """The Python value of a one-element CPU tensor (no device sync); ValueError for a tensor elsewhere."""
    if t.device.type != "cpu":
        raise ValueError(f"cpu_value: a {t.device.type} tensor would be a device sync here; this path is CPU-only")
    return t.item()
