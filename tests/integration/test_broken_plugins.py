"""A user's part that breaks its contract fails in one line that names it (tests/fixtures/my_lab_project/my_lab/
broken.py): at the first step for a result of the wrong shape or dtype, at the first read of the device for
non-finite weights, before the run directory exists for a config mistake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import SMOKE, run_cli

PROJECT = Path(__file__).parents[1] / "fixtures" / "my_lab_project"
SHORT = [*SMOKE, "trainer.max_steps=6", "trainer.log_every=3", "trainer.eval_every=6"]
WEIGHTING = ["balancer=gramian", "balancer.weighting._target_=my_lab.broken."]


def train(tmp_path: Path, monkeypatch, *args: str):
    monkeypatch.syspath_prepend(str(PROJECT))
    result = run_cli("train", *args, f"hydra.run.dir={tmp_path / 'run'}", *SHORT, cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert lines[-1].startswith("mtl-bench: error: ") and "Traceback" not in result.stderr
    return lines[-1].removeprefix("mtl-bench: error: ")


def weighting(name: str) -> list[str]:
    return [WEIGHTING[0], WEIGHTING[1] + name]


@pytest.mark.parametrize(
    ("name", "line"),
    [
        (
            "OneTooMany",
            "balancer.weighting (my_lab.broken.OneTooMany) returned weights of shape (3,); the contract: (2,), "
            "one per task",
        ),
        (
            "Moving",
            "balancer.weighting (my_lab.broken.Moving) returned torch.bool weights; the contract: a floating-point "
            "(2,) tensor",
        ),
        (
            "NaNAfter",  # NaN from step 3 on; the run reads the device at step 3 (log_every=3)
            "balancer.weighting (my_lab.broken.NaNAfter) returned non-finite weights at step 3 from a finite Gramian "
            "and losses (the step was skipped; checkpoints hold the last good state)",
        ),
    ],
)
def test_a_weighting_that_breaks_its_contract_is_named_at_once(tmp_path, monkeypatch, name, line):
    assert train(tmp_path, monkeypatch, *weighting(name)) == line
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert record["status"] == "failed" and record["step"] <= 3


def test_non_finite_weights_are_named_at_the_next_read_not_after_a_window(tmp_path, monkeypatch):
    """With log_every=5 the first read is at step 5: it names step 3, before the divergence window could."""
    line = train(tmp_path, monkeypatch, *weighting("NaNAfter"), "trainer.log_every=5")
    assert line.startswith("balancer.weighting (my_lab.broken.NaNAfter) returned non-finite weights at step 3 ")


def test_an_aggregator_writing_a_gradient_of_another_shape_is_named(tmp_path, monkeypatch):
    line = train(tmp_path, monkeypatch, "balancer._target_=my_lab.broken.FirstRowOnly")
    assert line.startswith("balancer (my_lab.broken.FirstRowOnly) wrote a gradient of shape (")
    assert "for a parameter of shape (" in line


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            weighting("NeedsScale"),
            "balancer.weighting.scale: my_lab.broken.NeedsScale needs it; add +balancer.weighting.scale=<value>",
        ),
        (
            weighting("NaNAftr"),
            "balancer.weighting._target_: module 'my_lab.broken' has no class 'NaNAftr' (did you mean "
            "my_lab.broken.NaNAfter?)",
        ),
        (
            ["+logger.mine._target_=my_lab.broken.NotALogger"],
            "logger.mine._target_: my_lab.broken.NotALogger has no log_hparams, log_image, flush, close; a logger "
            "subclasses mtl_bench.loggers.Logger (whose methods do nothing until overridden) or defines them all",
        ),
    ],
)
def test_a_config_mistake_in_a_users_part_is_one_line_before_the_run_starts(tmp_path, monkeypatch, args, line):
    assert train(tmp_path, monkeypatch, *args) == line
    assert not (tmp_path / "run").exists()  # refused before anything was built: no run directory left
