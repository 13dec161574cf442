"""COSMOS: the weights by hand, and the parameters of torchjd 0.18's COSMOS scalarization after 6 steps."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import COSMOS
from tests.helpers.balancer_kit import TASKS3, assert_same_parameters, make_model, train_ours, train_scalarizer


def test_weights_by_hand():
    # r = (1, 0), L = (3, 4): f = 3 − λ·3/5; ∂cos/∂L = r/(‖r‖‖L‖) − cos·L/‖L‖² = (1/5 − 0.6·3/25, −0.6·4/25).
    shared = torch.zeros(1, requires_grad=True)
    bal = COSMOS(["a", "b"], lambda_=2.0, preference={"a": 1.0, "b": 0.0})
    metrics = bal.backward({"a": (3.0 + shared).sum(), "b": (4.0 + shared).sum()}, shared)
    expected = [1 - 2 * (0.2 - 0.6 * 3 / 25), 0 - 2 * (-0.6 * 4 / 25)]
    assert [metrics["weight/a"].item(), metrics["weight/b"].item()] == pytest.approx(expected)


@pytest.mark.parametrize("lambda_", [0.0, 3.0])
def test_matches_torchjd_cosmos(lambda_):
    scalarization = pytest.importorskip("torchjd.scalarization")
    pref = {"a": 0.6, "b": 0.1, "c": 0.3}
    ours, reference = make_model(), make_model()
    train_ours(ours, COSMOS(list(TASKS3), lambda_=lambda_, preference=pref), 6)
    train_scalarizer(reference, scalarization.COSMOS(lambda_, torch.tensor(list(pref.values()))), 6)
    assert_same_parameters(ours, reference)
