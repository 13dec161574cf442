"""A diverged run is a failure, resume never trains another config than it records, damaged files and bad
places are one line, and a typo leaves no run directory behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError, DivergedError, NonFiniteLossError
from tests.helpers.cli import SMALL, run_cli


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`mtl-bench train ...` in this process (tests/test_cli.py runs the one-line errors in a fresh one)."""
    return run_cli("train", *args, cwd=cwd)


def test_a_run_whose_steps_are_mostly_skipped_stops_as_diverged(compose_cfg, tmp_path):
    cfg = compose_cfg(
        *SMALL,
        "optim=sgd",
        "optim.lr=1e8",
        "trainer.max_steps=100",
        "trainer.log_every=10",
        "trainer.skipped_window=20",
    )
    with pytest.raises(
        DivergedError,
        match=r"diverged: \d+ of the last \d+ steps were skipped .* the first: "
        r"non-finite (gradients|loss for task 't\d') at step \d+",
    ):
        train(cfg, tmp_path)
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["status"] == "diverged" and record["reason"].startswith("diverged:")


def test_raise_stops_on_non_finite_gradients_too(compose_cfg, tmp_path):
    cfg = compose_cfg(
        *SMALL,
        "optim=sgd",
        "optim.lr=1e8",
        "trainer.max_steps=100",
        "trainer.log_every=10",
        "trainer.on_nonfinite=raise",
    )
    with pytest.raises(
        NonFiniteLossError,
        match=r"non-finite (gradients|loss for task 't\d') at step \d+ "
        r"\(trainer.on_nonfinite=raise",
    ):
        train(cfg, tmp_path)


def test_resume_with_another_config_stops_and_keeps_the_record(tmp_path):
    run_dir = tmp_path / "run"
    assert cli(*SMALL, f"hydra.run.dir={run_dir}", "trainer.checkpoint_every=10", cwd=tmp_path).returncode == 0
    before = {
        name: (run_dir / name).read_bytes()
        for name in ("metrics.json", ".hydra/config.yaml", ".hydra/overrides.yaml", "checkpoints/last.pt")
    }
    result = cli(
        *SMALL,
        f"hydra.run.dir={run_dir}",
        "trainer.checkpoint_every=10",
        "trainer.resume=auto",
        "optim.lr=0.01",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "was trained with another config (optim.lr 0.001 -> 0.01)" in line and "start a new run" in line
    after = {name: (run_dir / name).read_bytes() for name in before}
    assert after == before  # what is recorded is what was trained


def test_resume_may_change_the_documented_keys(compose_cfg, tmp_path):
    train(compose_cfg(*SMALL, "trainer.max_steps=10"), tmp_path)
    result = train(compose_cfg(*SMALL, "trainer.max_steps=20", "trainer.log_every=10", "trainer.resume=auto"), tmp_path)
    assert result.step == 20


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not_ours"])
def test_a_damaged_checkpoint_is_one_line_and_changes_nothing(compose_cfg, tmp_path, damage):
    train(compose_cfg(*SMALL, "trainer.max_steps=10"), tmp_path)
    checkpoint = tmp_path / "checkpoints" / "last.pt"
    if damage == "truncated":
        checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    elif damage == "garbage":
        checkpoint.write_bytes(b"\x00not a checkpoint" * 10)
    else:
        torch.save({"weights": torch.zeros(3)}, checkpoint)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError) as info:
        train(compose_cfg(*SMALL, "trainer.max_steps=20", "trainer.resume=auto"), tmp_path)
    message = str(info.value)
    assert "\n" not in message and str(checkpoint) in message and "checkpoint" in message
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_checkpoint_of_the_earlier_balancer_layout_is_refused_in_one_line(compose_cfg, tmp_path):
    train(compose_cfg(*SMALL, "balancer=gradvac", "trainer.max_steps=10"), tmp_path)
    checkpoint = tmp_path / "checkpoints" / "last.pt"
    state = torch.load(checkpoint, weights_only=False)
    assert any(key.startswith("weighting.") for key in state["balancer"])
    # Before the method contracts a Gramian method kept its weighting's state (and its generator's) at the top.
    state["balancer"] = {k.removeprefix("weighting.").removeprefix("rng."): v for k, v in state["balancer"].items()}
    torch.save(state, checkpoint)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError) as info:
        train(compose_cfg(*SMALL, "balancer=gradvac", "trainer.max_steps=20", "trainer.resume=auto"), tmp_path)
    message = str(info.value)
    assert "\n" not in message and f"checkpoint {checkpoint} does not fit this config" in message
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_typo_leaves_no_run_directory_and_a_build_failure_leaves_a_record(tmp_path):
    typo = cli(*SMALL, f"hydra.run.dir={tmp_path / 'typo'}", "+balancer.nonsense=1", cwd=tmp_path)
    assert typo.returncode == 2 and not (tmp_path / "typo").exists()
    built = cli(*SMALL, f"hydra.run.dir={tmp_path / 'built'}", "balancer=gradnorm", "balancer.alpha=-1", cwd=tmp_path)
    assert built.returncode == 2
    # a value error is found while building: the run is recorded as failed with its reason
    record = json.loads((tmp_path / "built" / "metrics.json").read_text())
    assert record["status"] == "failed" and record["reason"] == "balancer.alpha: must be a number >= 0, got -1"


def test_an_output_directory_that_cannot_be_created_is_one_line(tmp_path):
    result = cli(*SMALL, "hydra.run.dir=/proc/mtl-bench-cannot-exist", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "mtl-bench: error: cannot write /proc/mtl-bench-cannot-exist: No such file or directory (set hydra.run.dir "
        "to a writable directory)"
    ]


def test_the_checkpoint_holds_the_config_it_trained(compose_cfg, tmp_path):
    train(compose_cfg(*SMALL, "optim.lr=0.002"), tmp_path)
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert OmegaConf.create(state["config"]).optim.lr == 0.002
