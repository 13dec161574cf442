"""Helpers for tests that start several processes (DDP with gloo on CPU)."""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any, Callable

import pytest
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_torchrun_env(rank: int, world: int, port: int) -> None:
    """The environment torchrun gives each process (read by mtl_bench.engine.distributed)."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def spawn_and_wait(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int, timeout_s: float, what: str) -> None:
    """Run fn(rank, *args) in nprocs processes; fail the test (killing them) if they are not done in time:
    a collective that one process never reaches would otherwise hang the suite."""
    context = mp.spawn(_exit_when_done, args=(fn, *args), nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(what)


def _exit_when_done(rank: int, fn: Callable[..., None], *args: Any) -> None:
    """fn(rank, *args), then leave at once when it returned: gloo's threads can outlive the process group into
    interpreter teardown, where an exiting rank was seen to abort ("terminate called without an active
    exception", SIGABRT) after all its work was done and saved. An exception still reaches mp.spawn as usual."""
    fn(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
