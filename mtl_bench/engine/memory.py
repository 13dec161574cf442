"""Peak memory of a run, recorded in metrics.json: the CUDA caching allocator's peak on a GPU (reset when the run
starts), else the process's peak resident set size (getrusage's ru_maxrss: the peak since the process started,
so for runs trained one after another in one process it is the largest so far, never less than this run's)."""

from __future__ import annotations

import sys
from typing import Any

import torch


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, Any] | None:
    """{"bytes": N, "kind": "cuda_max_allocated" | "cpu_peak_rss", "label": what the number is}; None where the
    platform does not say (no `resource` module: Windows)."""
    if device.type == "cuda":
        return {
            "bytes": int(torch.cuda.max_memory_allocated(device)),
            "kind": "cuda_max_allocated",
            "label": "CUDA allocator peak",
        }
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    unit = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return {"bytes": int(peak * unit), "kind": "cpu_peak_rss", "label": "CPU process peak RSS"}
