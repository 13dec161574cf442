"""Krum: the selection by hand, and the parameters of torchjd 0.18's Krum after 6 steps."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import Krum
from tests.helpers.balancer_kit import TASKS3, assert_same_parameters, make_model, train_ours, train_torchjd

TASKS5 = ("a", "b", "c", "d", "e")


def test_selection_by_hand():
    # Five 1-d gradients 0, 1, 2, 10, 11 with f = 1: each scores its 2 nearest others' distances:
    # 0: 1 + 2 = 3, 1: 1 + 1 = 2, 2: 1 + 2 = 3, 10: 1 + 8 = 9, 11: 1 + 9 = 10. Krum picks 1; Multi-Krum(3) 0, 1, 2.
    g = torch.tensor([0.0, 1.0, 2.0, 10.0, 11.0])
    gram = torch.outer(g, g)
    weights = Krum(list(TASKS5), grad_source="shared_rep", n_byzantine=1)._solve(gram, g).weights
    assert weights.tolist() == [0, 1, 0, 0, 0]
    weights = Krum(list(TASKS5), grad_source="shared_rep", n_byzantine=1, n_selected=3)._solve(gram, g).weights
    assert weights.tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0, 0])


@pytest.mark.parametrize("n_selected", [1, 2])
def test_matches_torchjd(n_selected):
    aggregation = pytest.importorskip("torchjd.aggregation")
    ours, reference = make_model(), make_model()
    train_ours(ours, Krum(list(TASKS3), list(ours.trunk.parameters()), n_selected=n_selected), 6)
    train_torchjd(reference, aggregation.Krum(n_byzantine=0, n_selected=n_selected), 6)
    assert_same_parameters(ours, reference)


def test_too_few_tasks_is_one_line():
    with pytest.raises(
        ValueError, match=r"^n_byzantine: must be an integer in \[0, -1\] for 2 tasks \(at most T - 3\)"
    ):
        Krum(["a", "b"], grad_source="shared_rep")
    with pytest.raises(ValueError, match=r"^n_selected: must be an integer in \[1, 3\] for 3 tasks \(at most T\)"):
        Krum(list(TASKS3), grad_source="shared_rep", n_selected=4)
