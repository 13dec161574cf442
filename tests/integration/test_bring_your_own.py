"""docs/library.md's "Bring your own model, task set or balancer", done as a user would: a package outside
mtl_bench (tests/fixtures/my_lab_project) on PYTHONPATH with its own config directory, through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.cli import run_cli

PROJECT = Path(__file__).parents[1] / "fixtures" / "my_lab_project"
SHORT = ["trainer.max_steps=6", "trainer.log_every=3", "trainer.eval_every=3", "trainer.batch_size=32"]


def train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "mtl_bench", "train", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_own_model_tasks_and_balancer_from_own_config_dir(tmp_path):
    run_dir = tmp_path / "run"
    result = train(
        "--config-dir",
        str(PROJECT / "my_conf"),
        "model=my_net",
        "tasks=my_tasks",
        "balancer=my_balancer",
        f"hydra.run.dir={run_dir}",
        *SHORT,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "completed" and set(metrics["test"]) == {"a", "b"}
    events = EventAccumulator(str(run_dir))
    events.Reload()
    weights = {task: [e.value for e in events.Scalars(f"weight/{task}")] for task in ("a", "b")}
    assert all(len(values) == 2 for values in weights.values())  # steps 3 and 6
    assert weights["b"][0] < weights["a"][0]  # b's loss is ~25x larger: a smaller inverse-loss weight


def train_here(*args: str, cwd: Path, monkeypatch) -> subprocess.CompletedProcess:
    """`train` in this process, the user's package on sys.path (the test above runs a fresh one)."""
    monkeypatch.syspath_prepend(str(PROJECT))
    return run_cli("train", *args, cwd=cwd)


def test_own_class_on_the_command_line_with_a_new_key(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    result = train_here(
        "model._target_=my_lab.nets.TinyNet",
        "+model.hidden=8",
        f"hydra.run.dir={run_dir}",
        *SHORT,
        cwd=tmp_path,
        monkeypatch=monkeypatch,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed"


def test_a_bad_value_of_a_users_class_is_one_line(tmp_path, monkeypatch):
    result = train_here(
        "--config-dir",
        str(PROJECT / "my_conf"),
        "balancer=my_balancer",
        "balancer.eps=0",
        f"hydra.run.dir={tmp_path / 'run'}",
        *SHORT,
        cwd=tmp_path,
        monkeypatch=monkeypatch,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["mtl-bench: error: balancer.eps: must be > 0, got 0"]


@pytest.mark.parametrize(
    "given, task",
    [
        (["--config-dir", str(PROJECT / "my_conf"), "experiment=with_print"], "t1"),
        (["+callbacks.val._target_=my_lab.callbacks.PrintVal", "+callbacks.val.task=t0"], "t0"),
    ],
    ids=["yaml", "command_line"],
)
def test_own_callback_from_own_config_dir_or_the_command_line(tmp_path, monkeypatch, given, task):
    """docs/library.md's callback (my_lab/callbacks.py), named by an experiment YAML of the user's config dir or on
    the command line: its hook runs at each val evaluation of a real run, with the argument given."""
    result = train_here(*given, f"hydra.run.dir={tmp_path / 'run'}", *SHORT, cwd=tmp_path, monkeypatch=monkeypatch)
    assert result.returncode == 0, result.stderr
    printed = [line.split(":")[0] for line in result.stdout.splitlines() if f"val loss of {task}" in line]
    assert printed == ["step 3", "step 6"]
