"""SmoothTchebycheff (STCH): the weights by hand, and the parameters of torchjd 0.18's STCH after 6 steps."""

from __future__ import annotations

import math

import pytest
import torch

from mtl_bench.balancers import SmoothTchebycheff
from tests.helpers.balancer_kit import TASKS3, assert_same_parameters, make_model, train_ours, train_scalarizer


def test_weights_by_hand():
    # λ = (1, 2), z = (0, 1), L = (3, 2): λ(L − z) = (3, 2); w = λ ⊙ softmax((3, 2)/μ), μ = 1.
    shared = torch.zeros(1, requires_grad=True)
    bal = SmoothTchebycheff(["a", "b"], mu=1.0, preference={"a": 1.0, "b": 2.0}, reference={"a": 0.0, "b": 1.0})
    metrics = bal.backward({"a": (3.0 + shared).sum(), "b": (2.0 + shared).sum()}, shared)
    soft = [math.e**3 / (math.e**3 + math.e**2), math.e**2 / (math.e**3 + math.e**2)]
    assert [metrics["weight/a"].item(), metrics["weight/b"].item()] == pytest.approx([soft[0], 2 * soft[1]])


@pytest.mark.parametrize("mu", [0.05, 1.0])
def test_matches_torchjd_stch(mu):
    scalarization = pytest.importorskip("torchjd.scalarization")
    pref = {"a": 0.2, "b": 0.3, "c": 0.5}
    ref = {"a": 0.1, "b": 0.0, "c": -0.2}
    ours, reference = make_model(), make_model()
    train_ours(ours, SmoothTchebycheff(list(TASKS3), mu=mu, preference=pref, reference=ref), 6)
    jd = scalarization.STCH(mu, torch.tensor(list(pref.values())), torch.tensor(list(ref.values())))
    train_scalarizer(reference, jd, 6)
    assert_same_parameters(ours, reference)


def test_default_preference_is_torchjds():
    scalarization = pytest.importorskip("torchjd.scalarization")
    ours, reference = make_model(), make_model()
    train_ours(ours, SmoothTchebycheff(list(TASKS3)), 6)
    train_scalarizer(reference, scalarization.STCH(0.1), 6)
    assert_same_parameters(ours, reference)
