"""trainer.on_nonfinite: a step with a non-finite loss is skipped on the device (skip) or stops the run (raise)."""

from __future__ import annotations

import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mtl_bench.engine import compose
from mtl_bench.engine.data import StepSampler
from mtl_bench.engine.recipe import train
from mtl_bench.errors import NonFiniteLossError

BAD_SAMPLE = 7


@pytest.fixture
def nan_target(monkeypatch):
    """Task t1's target of one training sample is NaN: every step whose batch holds it has a NaN loss."""
    build = compose.build

    def poisoned(key, *args, **kwargs):
        part = build(key, *args, **kwargs)
        if key == "tasks":
            part.train.targets["t1"][BAD_SAMPLE] = float("nan")
        return part

    monkeypatch.setattr("mtl_bench.engine.compose.build", poisoned)


def steps_with_bad_sample(n_steps: int, seed: int = 0) -> list[int]:
    sampler = StepSampler(512, 32, seed)
    return [s for s in range(n_steps) if BAD_SAMPLE in sampler.indices(s).tolist()]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_skip_leaves_the_model_finite_and_counts(small_conf, tmp_path, nan_target, precision):
    bad = steps_with_bad_sample(20)
    assert bad  # the sample is drawn at least once in 20 steps
    result = train(small_conf(f"precision={precision}", "optim=sgd"), tmp_path)
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    skipped = events.Scalars("steps/skipped")[-1].value
    if precision == "fp32":
        assert skipped == len(bad)
    else:  # the fp16 scaler may also skip overflowing steps of its own
        assert skipped >= len(bad)
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "completed"
    assert all(v["loss"] == v["loss"] for v in result.test.values())  # not NaN


def test_skipped_step_leaves_the_balancer_state_unchanged(small_conf, tmp_path, nan_target):
    train(small_conf("balancer=gradnorm", "optim=sgd"), tmp_path)
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["balancer"]
    assert state["opt_step"].item() == 20 - len(steps_with_bad_sample(20))
    assert torch.isfinite(state["weights"]).all()


def test_raise_names_task_and_step_and_keeps_the_last_checkpoint(small_conf, tmp_path, nan_target):
    first = steps_with_bad_sample(20)[0] + 1  # 1-based, as the log counts steps
    with pytest.raises(NonFiniteLossError, match=f"non-finite loss for task 't1' at step {first} "):
        train(small_conf("trainer.on_nonfinite=raise", "trainer.checkpoint_every=1"), tmp_path)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "failed" and "NonFiniteLossError" in metrics["error"]
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == first - 1  # the checkpoint before the bad step; the check runs before each save
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_non_finite_weights_of_a_non_finite_batch_are_not_the_methods_fault(small_conf, tmp_path, nan_target):
    """A NaN loss makes the Gramian NaN and so the weights: the step is skipped, and the method is not blamed."""
    train(small_conf("balancer=upgrad", "optim=sgd"), tmp_path)
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "completed"
