"""Stop signals: SIGINT (Ctrl-C), SIGTERM and SIGUSR1/SIGUSR2 (SLURM's and submitit's preemption notices) end the
current step, the run writes its checkpoint and exits; a second SIGINT aborts at once.

`StopSignals` installs the handlers for the loop's duration (main thread only) and puts the previous ones back;
under DDP the ranks agree on a stop at log points (one collective there), so they all stop after the same step.
`Preemption` is the loop's callback: it checks after each step, and after an evaluation or checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from mtl_bench.engine.callbacks import Callback
from mtl_bench.errors import RESUME_HINT_ENV, Interrupted

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import Recipe
    from mtl_bench.engine.step import StepResult


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


class Preemption(Callback):
    """Installs the stop signals' handlers for the loop; a stop writes the checkpoint (once) and raises Interrupted
    right after the step (so it starts no evaluation), or after the evaluation or checkpoint it came in."""

    def setup(self, run: Recipe) -> None:
        self.run = run
        self.signals = StopSignals(self.say, self.abort)

    def on_fit_start(self, run: Recipe) -> None:
        self.signals.__enter__()

    def on_loop_end(self, run: Recipe) -> None:
        self.signals.__exit__()

    def on_step_end(self, run: Recipe, result: StepResult, logging_now: bool) -> None:
        # After the last step too: the resumed run then only evaluates.
        self.check(run, logging_now)

    def on_checkpoint_or_eval_end(self, run: Recipe, logging_now: bool) -> None:
        self.check(run, logging_now)  # a signal during them

    def check(self, run: Recipe, logging_now: bool) -> None:
        world_size = 1 if run.dist is None else run.dist.world_size
        if self.signals.agreed(world_size, run.device, logging_now):
            self.stop(run)

    def say(self, message: str) -> None:
        if self.run.is_main:
            print(f"mtl-bench: {message}", file=sys.stderr, flush=True)

    def abort(self, signum: int) -> None:
        """Leave now, from wherever the main thread is: a checkpoint being written is dropped (its temp file is
        removed; checkpoints/last.pt is only ever replaced by a complete file), the last one stays as it was."""
        run, state = self.run, self.run.state
        if state.saved_step is None:
            kept = "no checkpoint was written"
        else:
            kept = f"checkpoint {state.path} (step {state.saved_step}) is unchanged. {resume_hint(run.run_dir)}"
        message = f"aborted by a second {signal_name(signum)} at step {run.step}; {kept}"
        self.say(message)
        raise Interrupted(signum, message)

    def stop(self, run: Recipe) -> None:
        received = self.signals.received
        assert received is not None
        run.nonfinite.check(run.step)  # a checkpoint holds a good state only
        if run.state.saved_step != run.step:  # not just written by the periodic checkpoint
            run.save(run.elapsed())
        message = (
            f"stopped by {signal_name(received)} after step {run.step}; checkpoint {run.state.path} written. "
            f"{resume_hint(run.run_dir)}"
        )
        self.say(message)
        self.signals.hand_over()
        run.stopped_together = True
        raise Interrupted(received, message)
