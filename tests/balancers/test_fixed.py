"""FixedWeights: the gradient of sum_k w_k L_k, and the weights/tasks check of the builder."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import FixedWeights
from mtl_bench.balancers.checks import task_weights


def fixed(weights):
    return FixedWeights(list(weights), weights=weights)


def test_gradient_is_the_weighted_sum_of_task_gradients():
    x = torch.tensor([2.0], requires_grad=True)
    losses = {"a": (x**2).sum(), "b": (3 * x).sum()}  # dL_a/dx = 2x = 4, dL_b/dx = 3
    metrics = fixed({"a": 1.0, "b": 4.0}).backward(losses, x)
    assert x.grad.item() == pytest.approx(1.0 * 4 + 4.0 * 3)
    assert metrics["weight/b"].item() == 4.0 and metrics["weight/a"].dim() == 0


def test_losses_must_match_tasks():
    x = torch.zeros(1, requires_grad=True)
    with pytest.raises(KeyError, match="do not match"):
        fixed({"a": 1.0}).backward({"b": x.sum()}, x)


def test_negative_weight_rejected():
    with pytest.raises(ValueError, match="weights.a: must be a number >= 0"):
        fixed({"a": -1.0})


def test_weights_survive_state_dict_round_trip():
    sd = fixed({"a": 2.0, "b": 0.5}).state_dict()
    other = fixed({"a": 1.0, "b": 1.0})
    other.load_state_dict(sd)
    assert other.weighting.weights.tolist() == [2.0, 0.5]


def test_null_weights_mean_one_each():
    assert task_weights(None, ["t0", "t1"]) == {"t0": 1.0, "t1": 1.0}


def test_mismatch_names_both_sets():
    with pytest.raises(ValueError) as info:
        task_weights({"t0": 1.0, "t9": 2.0}, ["t0", "t1"])
    message = str(info.value)
    assert "['t9']" in message and "['t1']" in message and "['t0', 't1']" in message


def test_per_task_backward_accumulates_the_joint_gradient():
    x = torch.tensor([2.0], requires_grad=True)
    balancer = fixed({"a": 1.0, "b": 4.0})
    metrics = balancer.backward_task("a", (x**2).sum(), x) | balancer.backward_task("b", (3 * x).sum(), x)
    metrics |= balancer.step()
    assert x.grad.item() == pytest.approx(1.0 * 4 + 4.0 * 3)
    assert metrics["weight/a"].item() == 1.0 and metrics["weight/b"].item() == 4.0
    with pytest.raises(KeyError, match="'c'"):
        balancer.backward_task("c", x.sum(), x)
