"""One line that says which machine produced a table (benchmarks and evidence runs cite it)."""

from __future__ import annotations

import os
import platform


def machine_description() -> str:
    """CPU model, cores, torch version and threads, load average (a busy machine skews timings)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (
        f"{cpu}, {os.cpu_count()} cores{gpu}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {load:.2f}"
    )
