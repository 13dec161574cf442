"""Stop signals: SIGINT (Ctrl-C), SIGTERM and SIGUSR1/SIGUSR2 (SLURM's and submitit's preemption notices) end the
current step, the run writes its checkpoint and exits; a second SIGINT aborts at once.

`StopSignals` installs the handlers for the loop's duration (main thread only) and puts the previous ones back;
under DDP the ranks agree on a stop at log points (one collective there), so they all stop after the same step.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable, Optional

import torch

from mtl_bench.errors import RESUME_HINT_ENV


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def resume_hint(run_dir: Any) -> str:
    return os.environ.get(RESUME_HINT_ENV) or (
        f"Resume with the same command plus hydra.run.dir={run_dir} trainer.resume=auto"
    )


class StopSignals:
    """`received`: the first stop signal, or None. `say(message)` tells the user (rank 0); `abort(signum)` is
    called on a second SIGINT and must raise (it runs inside the signal handler)."""

    def __init__(self, say: Callable[[str], None], abort: Callable[[int], None]) -> None:
        self.say, self.abort = say, abort
        self.received: Optional[int] = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self
        signals = [signal.SIGINT, signal.SIGTERM] + [
            getattr(signal, name) for name in ("SIGUSR1", "SIGUSR2") if hasattr(signal, name)
        ]
        pid = os.getpid()

        def stop(signum: int, frame: Any) -> None:
            if os.getpid() != pid:  # a forked loader worker (Ctrl-C reaches the whole process group): the run stops it
                return
            if self.received is None:
                self.received = signum
                self.say(
                    f"{signal_name(signum)}: stopping after the current step (Ctrl-C again aborts at once, without "
                    "a checkpoint)"
                )
            elif signum == signal.SIGINT:  # a user who will not wait; another preemption notice just waits
                self.abort(signum)

        self.previous = {signum: signal.signal(signum, stop) for signum in signals}
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def agreed(self, world_size: int, device: torch.device, logging_now: bool) -> bool:
        """Whether a stop signal came; under DDP the ranks agree at log points (one collective there)."""
        if world_size == 1:
            return self.received is not None
        if not logging_now:
            return False
        flag = torch.tensor([float(self.received or 0)], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        self.received = int(flag.item()) or None
        return self.received is not None

    def hand_over(self) -> None:
        """Call the handler this one replaced for the received signal: submitit's preemption handler requeues the
        job, which resumes from the checkpoint just written."""
        assert self.received is not None
        previous = self.previous.get(self.received)
        if callable(previous) and previous is not signal.default_int_handler:
            previous(self.received, None)
