"""ScaleInvariant (SI): w_i = c_i / L_i by hand, and the parameters of Nash-MTL's code after 6 steps."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import ScaleInvariant
from tests.helpers.balancer_kit import TASKS3, assert_same_parameters, make_model, train_ours, train_scalarizer


def test_weights_by_hand():
    shared = torch.zeros(1, requires_grad=True)
    losses = {"a": (2.0 + shared).sum(), "b": (0.5 + 3 * shared).sum()}  # dL/dshared = (1, 3)
    metrics = ScaleInvariant(["a", "b"], weights={"a": 1.0, "b": 2.0}).backward(losses, shared)
    assert [metrics["weight/a"].item(), metrics["weight/b"].item()] == pytest.approx([0.5, 4.0])
    assert shared.grad.item() == pytest.approx(0.5 * 1 + 4.0 * 3)


def test_a_scaled_loss_gives_the_same_update():
    shared = torch.ones(1, requires_grad=True)
    ScaleInvariant(["a"]).backward({"a": (shared**2).sum()}, shared)
    once = shared.grad.clone()
    shared.grad = None
    ScaleInvariant(["a"]).backward({"a": (100 * shared**2).sum()}, shared)
    torch.testing.assert_close(shared.grad, once)


def test_matches_nash_mtl_code():
    """AvivNavon/nash-mtl methods/weight_methods.py ScaleInvariantLinearScalarization (commit cce1840), whose
    get_weighted_loss is `torch.sum(torch.log(losses) * self.task_weights)`, transcribed as the objective."""
    scales = torch.tensor([1.0, 0.5, 2.0])
    ours, reference = make_model(), make_model()
    train_ours(ours, ScaleInvariant(list(TASKS3), weights=dict(zip(TASKS3, scales.tolist()))), 6)
    train_scalarizer(reference, lambda losses: torch.sum(torch.log(losses) * scales), 6)
    assert_same_parameters(ours, reference)
