"""A run's record is written once: a resume in place that fails, is refused or is stopped before it writes a
checkpoint leaves .hydra/, the checkpoint, the log and metrics.json as the run left them; the attempt's own config,
log and failure go to .hydra/attempts/<n>/. One that trains on makes its record the run's."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import SMOKE, run_cli

PROJECT = Path(__file__).parents[1] / "fixtures" / "my_lab_project"
FIRST = [*SMOKE, "trainer.max_steps=6"]
RESUME = [*SMOKE, "trainer.max_steps=10", "trainer.resume=auto"]
RECORD = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "checkpoints/last.pt", "train.log")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("first") / "run"
    result = run_cli("train", f"hydra.run.dir={run_dir}", *FIRST)
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.fixture
def run_dir(trained, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def record(run_dir: Path) -> dict[str, str]:
    return {name: hashlib.sha256((run_dir / name).read_bytes()).hexdigest() for name in (*RECORD, "metrics.json")}


def resume(run_dir: Path, monkeypatch, *extra: str) -> str:
    monkeypatch.syspath_prepend(str(PROJECT))
    result = run_cli("train", f"hydra.run.dir={run_dir}", *RESUME, *extra, cwd=run_dir.parent)
    assert result.returncode == 2, result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["+logger.down._target_=my_lab.broken.Unreachable"], "logger.down.url: cannot reach"),  # fails in setup
        (["+trainer.max_step=10"], "trainer.max_step: not a key of trainer"),  # refused before anything is built
        (["optim.lr=0.5"], "was trained with another config (optim.lr 0.001 -> 0.5)"),  # refused at the checkpoint
    ],
    ids=["bad logger", "bad key", "changed config"],
)
def test_a_failed_resume_leaves_the_runs_record(run_dir, monkeypatch, extra, says):
    before = record(run_dir)
    assert says in resume(run_dir, monkeypatch, *extra)
    assert record(run_dir) == before
    attempt = run_dir / ".hydra" / "attempts" / "1"
    assert [o for o in _overrides(attempt) if o in extra] == extra  # the attempt's own config
    assert (attempt / "train.log").is_file()
    if (attempt / "metrics.json").is_file():  # a failure after the config was accepted is recorded there
        assert json.loads((attempt / "metrics.json").read_text())["status"] == "failed"


def _overrides(attempt: Path) -> list[str]:
    from omegaconf import OmegaConf

    return list(OmegaConf.load(attempt / "overrides.yaml"))


def test_a_resume_that_trains_on_makes_its_record_the_runs(run_dir, monkeypatch):
    resume(run_dir, monkeypatch, "optim.lr=0.5")  # attempt 1: refused
    monkeypatch.syspath_prepend(str(PROJECT))
    result = run_cli("train", f"hydra.run.dir={run_dir}", *RESUME, cwd=run_dir.parent)
    assert result.returncode == 0, result.stderr
    assert "trainer.max_steps=10" in _overrides(run_dir / ".hydra")
    assert (run_dir / ".hydra" / "attempts" / "2" / "config.yaml").is_file()
    assert json.loads((run_dir / "metrics.json").read_text())["step"] == 10
    log = (run_dir / "train.log").read_text()
    assert "resumed from" in log and "0.001 -> 0.5" not in log  # the refused attempt's lines stay in its own log


@pytest.mark.slow  # a fresh interpreter (10-15 s on a busy 2-core machine): the signal must meet a real process
def test_sigterm_during_the_resumes_setup_leaves_the_runs_record(run_dir):
    before = record(run_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mtl_bench", "train", f"hydra.run.dir={run_dir}", *RESUME],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    started = run_dir / ".hydra" / "attempts" / "1" / "config.yaml"
    deadline = time.monotonic() + 120
    while not started.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started.is_file(), proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)  # the attempt has begun (Hydra wrote its config); setup is under way
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert record(run_dir) == before
