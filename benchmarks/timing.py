"""Interleaved timing rounds and markdown tables with ratios to a baseline measured in the same run.

Variants run round after round in alternating order and each is summarised by its median, so load from
other processes that drifts during the run hits every variant alike.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

import torch

Key = TypeVar("Key", bound=Hashable)


def sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (a host-device sync point: only around timed blocks)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], Any], calls: int, device: torch.device | None = None) -> float:
    """Mean wall seconds of one `fn()` over `calls` calls, the device synchronised before and after."""
    if device is not None:
        sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if device is not None:
        sync(device)
    return (time.perf_counter() - start) / calls


def interleaved(variants: Mapping[Key, Callable[[], float]], rounds: int) -> dict[Key, list[float]]:
    """Each variant's measurements over `rounds` rounds; each round calls every variant once, in the order given
    on even rounds and reversed on odd ones (neither goes first every time)."""
    if rounds < 1:
        raise ValueError(f"rounds: must be >= 1, got {rounds}")
    results: dict[Key, list[float]] = {name: [] for name in variants}
    for rnd in range(rounds):
        order = list(variants) if rnd % 2 == 0 else list(variants)[::-1]
        for name in order:
            results[name].append(variants[name]())
    return results


def medians(results: Mapping[Key, Sequence[float]]) -> dict[Key, float]:
    return {name: statistics.median(values) for name, values in results.items()}


def timed_command(cmd: Sequence[str], cwd: str, env: Mapping[str, str] | None = None) -> float:
    """Wall seconds of a command run to completion (its output discarded; a failure raises)."""
    start = time.perf_counter()
    subprocess.run(
        list(cmd),
        cwd=cwd,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    return time.perf_counter() - start


def ratio(value: float, base: float) -> str:
    """`value / base` as a table cell, e.g. '1.23x'."""
    return f"{value / base:.2f}x"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table; a column whose cells all read as numbers (a trailing 'x' or '%' allowed) is right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    for row in cells:
        if len(row) != len(header):
            raise ValueError(f"rows: a row has {len(row)} cells, the header {len(header)}: {row}")

    def numeric(text: str) -> bool:
        try:
            float(text.rstrip("x%").replace(",", ""))
        except ValueError:
            return text == ""
        return True

    align = ["---:" if cells and all(numeric(r[i]) for r in cells) else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)
