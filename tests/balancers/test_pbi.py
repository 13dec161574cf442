"""PenaltyBoundaryIntersection (PBI): the weights by hand, and the parameters of torchjd 0.18's PBI after 6 steps."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import PenaltyBoundaryIntersection
from tests.helpers.balancer_kit import TASKS3, assert_same_parameters, make_model, train_ours, train_scalarizer


def test_weights_by_hand():
    # ŵ = (1, 0), z = 0, L = (3, 4): d1 = 3, d2 = 4 (gradient (0, 1)), so w = (1, θ).
    shared = torch.zeros(1, requires_grad=True)
    bal = PenaltyBoundaryIntersection(["a", "b"], theta=5.0, preference={"a": 2.0, "b": 0.0})
    metrics = bal.backward({"a": (3.0 + shared).sum(), "b": (4.0 + shared).sum()}, shared)
    assert [metrics["weight/a"].item(), metrics["weight/b"].item()] == pytest.approx([1.0, 5.0])


def test_matches_torchjd_pbi():
    scalarization = pytest.importorskip("torchjd.scalarization")
    pref = {"a": 0.5, "b": 0.2, "c": 0.3}
    ref = {"a": 0.05, "b": 0.0, "c": 0.1}
    ours, reference = make_model(), make_model()
    train_ours(ours, PenaltyBoundaryIntersection(list(TASKS3), theta=2.0, preference=pref, reference=ref), 6)
    jd = scalarization.PBI(2.0, torch.tensor(list(pref.values())), torch.tensor(list(ref.values())))
    train_scalarizer(reference, jd, 6)
    assert_same_parameters(ours, reference)


def test_weights_by_hand_with_the_drawn_direction():
    # ŵ = r/‖r‖, f = L − z, p = f − (f·ŵ)ŵ: w = ∂(d1 + θ‖p‖)/∂L = ŵ + θ p/‖p‖ (p ⊥ ŵ).
    z = torch.tensor([0.5, 0.0, 0.2])
    bal = PenaltyBoundaryIntersection(
        list(TASKS3), theta=3.0, preference="dirichlet", reference=dict(zip(TASKS3, z.tolist())), seed=4
    )
    losses = torch.tensor([3.0, 4.0, 1.0])
    for _ in range(3):  # a new direction each step
        shared = torch.zeros(1, requires_grad=True)
        metrics = bal.backward({t: (v + shared).sum() for t, v in zip(TASKS3, losses.tolist())}, shared)
        unit = torch.stack([metrics[f"preference/{t}"] for t in TASKS3])
        unit = unit / unit.norm()
        f = losses - z
        p = f - (f @ unit) * unit
        torch.testing.assert_close(torch.stack([metrics[f"weight/{t}"] for t in TASKS3]), unit + 3.0 * p / p.norm())


def test_matches_torchjd_pbi_reassigned_a_drawn_direction_each_step():
    """Pareto-front training: a new direction before every step; torchjd's PBI given it trains the same net."""
    scalarization = pytest.importorskip("torchjd.scalarization")
    ours = make_model()
    history = train_ours(ours, PenaltyBoundaryIntersection(list(TASKS3), theta=2.0, preference="dirichlet"), 6)
    drawn = iter([torch.stack([m[f"preference/{t}"] for t in TASKS3]) for m in history])
    pbi = scalarization.PBI(2.0, torch.ones(3))

    def front_step(losses: torch.Tensor) -> torch.Tensor:
        pbi.weights = next(drawn)
        return pbi(losses)

    reference = make_model()
    train_scalarizer(reference, front_step, 6)
    assert_same_parameters(ours, reference)
