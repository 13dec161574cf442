"""Ctrl-C and preemption lose nothing: a signal mid-run ends the step, writes a checkpoint, says how to resume
and exits 128 + signal; resuming ends with the same numbers as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUN = ["trainer.max_steps=300", "trainer.log_every=10", "trainer.eval_every=100", "trainer.checkpoint_every=100",
       "trainer.progress=log", "tasks.n_train=512", "tasks.n_val=64", "tasks.n_test=64", "trainer.batch_size=32",
       "model.widths=[64,64]"]


def start(run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mtl_bench", "train", f"hydra.run.dir={run_dir}", *RUN, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = run_dir / "train.log"
        if log.is_file() and f"step {step}/" in log.read_text():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise TimeoutError(f"step {step} not reached")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_checkpoints_and_resume_gives_the_uninterrupted_numbers(tmp_path, signum):
    whole = start(tmp_path / "whole")
    assert whole.wait(timeout=300) == 0
    expected = json.loads((tmp_path / "whole" / "metrics.json").read_text())

    run_dir = tmp_path / "cut"
    proc = start(run_dir)
    wait_for_step(run_dir, 20, proc)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"mtl-bench: stopped by {signal.Signals(signum).name} after step ")
    assert f"hydra.run.dir={run_dir} trainer.resume=auto" in last
    stopped = json.loads((run_dir / "metrics.json").read_text())
    assert stopped["status"] == "interrupted" and 20 <= stopped["step"] < 300

    resumed = start(run_dir, "trainer.resume=auto")
    assert resumed.wait(timeout=300) == 0, resumed.communicate()
    got = json.loads((run_dir / "metrics.json").read_text())
    assert got["status"] == "completed" and got["step"] == 300
    assert got["test"] == expected["test"]
