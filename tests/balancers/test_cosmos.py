"""COSMOS: the weights by hand, and the parameters of torchjd 0.18's COSMOS scalarization after 6 steps (a fixed r,
and a drawn r reassigned before each step as the paper trains)."""

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


def test_weights_by_hand_with_the_drawn_preference():
    # With the step's drawn r and L = (3, 4, 1): w = r − λ(r/(‖r‖‖L‖) − cos(r, L)·L/‖L‖²).
    bal = COSMOS(list(TASKS3), lambda_=2.0, preference="dirichlet", alpha=0.7, seed=1)
    losses = torch.tensor([3.0, 4.0, 1.0])
    for _ in range(3):  # a new r each step
        shared = torch.zeros(1, requires_grad=True)
        metrics = bal.backward({t: (v + shared).sum() for t, v in zip(TASKS3, losses.tolist())}, shared)
        r = torch.stack([metrics[f"preference/{t}"] for t in TASKS3])
        cos = (r @ losses) / (r.norm() * losses.norm())
        expected = r - 2.0 * (r / (r.norm() * losses.norm()) - cos * losses / losses.norm() ** 2)
        torch.testing.assert_close(torch.stack([metrics[f"weight/{t}"] for t in TASKS3]), expected)


def test_matches_torchjd_cosmos_reassigned_a_drawn_r_each_step():
    """The paper's loop: a new r before every step; torchjd's scalarizer given the same r trains the same net."""
    scalarization = pytest.importorskip("torchjd.scalarization")
    ours = make_model()
    history = train_ours(ours, COSMOS(list(TASKS3), lambda_=3.0, preference="dirichlet", seed=2), 6)
    preferences = [torch.stack([m[f"preference/{t}"] for t in TASKS3]) for m in history]
    assert len({tuple(r.tolist()) for r in preferences}) == 6  # a new r each step
    drawn = iter(preferences)
    cosmos = scalarization.COSMOS(3.0, torch.ones(3))

    def paper_step(losses: torch.Tensor) -> torch.Tensor:
        cosmos.weights = next(drawn)
        return cosmos(losses)

    reference = make_model()
    train_scalarizer(reference, paper_step, 6)
    assert_same_parameters(ours, reference)
