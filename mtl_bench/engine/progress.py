"""Progress: a rich bar with live losses on a terminal; periodic log lines otherwise (files, sweeps)."""

from __future__ import annotations

import logging
import sys
from typing import Mapping

log = logging.getLogger("mtl_bench")


def use_bar(mode: str, multirun: bool) -> bool:
    if mode == "log":
        return False
    if mode == "bar":
        return True
    return sys.stderr.isatty() and not multirun


class Progress:
    """Shows step and the last logged losses. Values arrive only at log points (no per-step host sync)."""

    def __init__(self, total: int, start: int, bar: bool) -> None:
        self.total = total
        self._bar = None
        if bar:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"),
                transient=False,
            )
            self._task = self._bar.add_task("train", total=total, completed=start, status="")
            self._bar.start()

    def update(self, step: int, losses: Mapping[str, float] | None = None, steps_per_s: float | None = None) -> None:
        if losses is None:
            if self._bar is not None:
                self._bar.update(self._task, completed=step)
            return
        text = " ".join(f"{name} {value:.4g}" for name, value in losses.items())
        rate = f" | {speed(steps_per_s)}" if steps_per_s is not None else ""
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=f"loss {text}{rate}")
        else:
            log.info("step %d/%d | loss %s%s", step, self.total, text, rate)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def speed(steps_per_s: float) -> str:
    """`12 steps/s` for fast steps, `3.4 s/step` for slow ones (a rate below one would round to 0 steps/s)."""
    if steps_per_s >= 1:
        return f"{steps_per_s:.0f} steps/s"
    return f"{1 / steps_per_s:.2g} s/step" if steps_per_s > 0 else "no step finished"
