"""The loss-level scalarizations (SI, GLS, STCH, COSMOS, PBI): what they share (balancers/scalarization.py):
AMP equals fp32, DDP equals one process on the whole batch, per-task mode where the weights allow it."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import (
    COSMOS,
    BackwardContext,
    GeometricLoss,
    PenaltyBoundaryIntersection,
    ScaleInvariant,
    SmoothTchebycheff,
)
from tests.helpers.balancer_kit import (
    TASKS,
    TASKS3,
    assert_ddp_is_one_process_on_the_whole_batch,
    assert_per_task_is_the_joint_step,
    assert_scaler_is_fp32_and_a_skip_changes_nothing,
    metrics_without_host_sync,
)

CLASSES = {
    "si": ScaleInvariant,
    "gls": GeometricLoss,
    "stch": SmoothTchebycheff,
    "cosmos": COSMOS,
    "pbi": PenaltyBoundaryIntersection,
}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_scaler_gives_the_fp32_step(name):
    assert_scaler_is_fp32_and_a_skip_changes_nothing(lambda model: CLASSES[name](list(TASKS)), range(4))


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_no_host_sync_and_0d_metrics(name, monkeypatch):
    bal = CLASSES[name](list(TASKS))
    metrics = metrics_without_host_sync(bal, monkeypatch, per_task=name == "si")
    assert set(metrics) == {"weight/a", "weight/b"}


def make_gls(names, model):
    return GeometricLoss(names)


@pytest.mark.slow  # two gloo processes, each starting torch
def test_ddp_is_one_process_on_the_whole_batch(tmp_path):
    """GLS's weights are not linear in the losses: they come from the rank-averaged losses."""
    assert_ddp_is_one_process_on_the_whole_batch(tmp_path, make_gls, steps=3)


def test_si_per_task_mode_with_scaler_is_the_joint_step():
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    assert_per_task_is_the_joint_step(lambda model: ScaleInvariant(list(TASKS3)), ["c", "a", "b"], ctx, 2.0**8)


@pytest.mark.parametrize("name", ["gls", "stch", "cosmos", "pbi"])
def test_the_others_refuse_per_task_mode(name):
    bal = CLASSES[name](list(TASKS))
    assert "has no per-task mode" in bal.per_task_problem()
    shared = torch.zeros(1, requires_grad=True)
    with pytest.raises(NotImplementedError, match="trainer.step_mode=joint"):
        bal.backward_task("a", shared.sum() + 1, shared)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: SmoothTchebycheff(["a", "b"], mu=0.0), "^mu: must be a number > 0"),
        (lambda: COSMOS(["a", "b"], lambda_=-1.0), "^lambda_: must be a number >= 0"),
        (lambda: PenaltyBoundaryIntersection(["a", "b"], theta=-2.0), "^theta: must be a number >= 0"),
        (lambda: COSMOS(["a", "b"], preference={"a": 1.0}), r"^preference: no weight for tasks \['b'\]"),
        (lambda: SmoothTchebycheff(["a", "b"], preference={"a": -1.0, "b": 1.0}), "^preference.a: must be"),
        (lambda: PenaltyBoundaryIntersection(["a", "b"], preference={"a": 0, "b": 0}), "^preference: at least one"),
        (lambda: SmoothTchebycheff(["a", "b"], reference={"a": 0.0}), "^reference: tasks"),
        (lambda: PenaltyBoundaryIntersection(["a", "b"], reference={"a": 0.0, "b": "x"}), "^reference.b: must be"),
        (lambda: ScaleInvariant(["a", "b"], weights={"a": 1.0}), r"^weights: no weight for tasks \['b'\]"),
    ],
)
def test_bad_options_name_the_option(build, message):
    with pytest.raises(ValueError, match=message):
        build()
