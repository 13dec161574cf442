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

RUN = [
    "trainer.max_steps=300",
    "trainer.log_every=10",
    "trainer.eval_every=100",
    "trainer.checkpoint_every=100",
    "trainer.progress=log",
    "tasks.n_train=512",
    "tasks.n_val=64",
    "tasks.n_test=64",
    "trainer.batch_size=32",
    "model.widths=[64,64]",
]


def start(run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mtl_bench", "train", f"hydra.run.dir={run_dir}", *RUN, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


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


def test_a_requeued_submitit_job_resumes_its_interrupted_run(compose_cfg, tmp_path, monkeypatch):
    """submitit's handler requeues the job with the same arguments; the new job finds its interrupted run."""
    from mtl_bench.engine.recipe import Recipe, train

    small = ["trainer=smoke", "tasks.n_train=256", "tasks.n_val=32", "tasks.n_test=32", "model.widths=[16]"]
    train(compose_cfg(*small, "trainer.max_steps=10"), tmp_path)
    record = json.loads((tmp_path / "metrics.json").read_text())
    (tmp_path / "metrics.json").write_text(json.dumps({**record, "status": "interrupted"}))
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    recipe = Recipe(compose_cfg(*small, "trainer.max_steps=20"), tmp_path)
    recipe.setup()
    try:
        assert recipe.step == 10
    finally:
        recipe.cleanup()


def test_the_stop_signal_is_passed_on_to_submitits_handler(compose_cfg, tmp_path):
    """After the checkpoint, the handler that was installed before (submitit's requeue) runs."""
    from mtl_bench.engine.recipe import Recipe
    from mtl_bench.errors import Interrupted

    seen = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    try:
        recipe = Recipe(
            compose_cfg(
                "trainer=smoke", "tasks.n_train=256", "tasks.n_val=32", "tasks.n_test=32", "trainer.max_steps=50"
            ),
            tmp_path,
        )
        recipe.setup()
        original = recipe.optimizer_step

        def step_then_signal(logging_now):
            result = original(logging_now)
            if recipe.step == 3:
                os.kill(os.getpid(), signal.SIGUSR2)
            return result

        recipe.optimizer_step = step_then_signal
        with pytest.raises(Interrupted):
            recipe.train()
        recipe.cleanup()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert seen == [signal.SIGUSR2]
    assert (tmp_path / "checkpoints" / "last.pt").is_file()
