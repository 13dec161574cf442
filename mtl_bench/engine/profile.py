"""`trainer.profile=true`: a torch profiler trace of a few steps, written for TensorBoard's profile plugin."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

# Skip 1 step (start-up), warm up 1, record 3: enough to see where a step's time goes.
WAIT, WARMUP, ACTIVE = 1, 1, 3


class _NoProfiler:
    def step(self) -> None:
        pass


@contextlib.contextmanager
def maybe_profile(enabled: bool, run_dir: Path) -> Iterator[Any]:
    """Yields an object with `.step()` to call after every optimizer step; traces go to run_dir/profile."""
    if not enabled:
        yield _NoProfiler()
        return
    import torch
    import torch.profiler as tp

    activities = [tp.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(tp.ProfilerActivity.CUDA)
    with tp.profile(
        activities=activities,
        schedule=tp.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
        on_trace_ready=tp.tensorboard_trace_handler(str(run_dir / "profile")),
        record_shapes=True,
    ) as profiler:
        yield profiler
