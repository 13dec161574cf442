"""GradVac: one correction by hand, against torchjd 0.18 over enough steps that the EMA targets matter,
LibMTL 1.1.5's first step (its EMA bug differs after), groups, resume and skipped steps."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from mtl_bench.balancers import BackwardContext, GradVac
from mtl_bench.balancers.gradvac import gradvac_weights
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_same_parameters,
    batch,
    libmtl_weighting,
    make_model,
    task_losses,
    train_libmtl,
    train_ours,
    train_torchjd,
)


def build(model, tasks=TASKS3, **options) -> GradVac:
    return GradVac(list(tasks), list(model.trunk.parameters()), **options)


def test_one_correction_by_hand():
    # g1 = (1, 0), g2 = (0, 1): cos 0 < target 0.5 → g1 gets w g2 with cos(g1 + w g2, g2) = 0.5: w = 1/√3.
    gram = np.eye(2)
    weights, targets, corrections = gradvac_weights(gram, np.full((2, 2), 0.5), 0.1, [[1], [0]])
    assert weights.tolist() == pytest.approx([1 + 3**-0.5, 1 + 3**-0.5]) and corrections == 2
    assert targets[0, 1] == pytest.approx(0.9 * 0.5 + 0.1 * 0.0)
    # Target 0 and a conflict: the PCGrad projection (cos raised to exactly 0).
    weights, _, _ = gradvac_weights(np.array([[1.0, -1.0], [-1.0, 2.0]]), np.zeros((2, 2)), 0.5, [[1], [0]])
    assert weights.tolist() == pytest.approx([2.0, 1.5], rel=1e-6)


def test_matches_torchjd_over_steps_seeded_alike():
    aggregation = pytest.importorskip("torchjd.aggregation")
    ours, reference = make_model(), make_model()
    bal = build(ours, beta=0.5, seed=21)
    history = train_ours(ours, bal, 8)
    torch.manual_seed(21)
    train_torchjd(reference, aggregation.GradVac(beta=0.5), 8)
    assert_same_parameters(ours, reference)
    assert sum(m["gradvac/corrections"].item() for m in history[1:]) > 0  # the targets acted
    assert (bal.weighting.targets > 0).any()


def test_first_step_matches_libmtl_1_1_5():
    tasks = ("a", "b")
    ours, reference = make_model(tasks), make_model(tasks)
    train_ours(ours, build(ours, tasks, seed=0), 1, tasks)
    train_libmtl(reference, libmtl_weighting("GradVac", reference, tasks), 1, tasks, beta=0.5)
    assert_same_parameters(ours, reference)


def test_all_matrix_with_one_tensor_is_whole_model():
    theta = nn.Parameter(torch.tensor([0.3, -0.2, 0.5]))
    directions = {
        "a": torch.tensor([1.0, 0.0, 0.5]),
        "b": torch.tensor([-1.0, 1.0, 0.0]),
        "c": torch.tensor([0.2, -1.0, 1.0]),
    }
    grads = []
    for group in ("whole_model", "all_matrix"):
        theta.grad = None
        bal = GradVac(list(TASKS3), [theta], group=group, seed=1)
        bal.weighting.targets.fill_(0.3)
        shared = theta * 1.0
        bal.backward({t: shared @ d for t, d in directions.items()}, shared)
        grads.append(theta.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_resume_and_skipped_steps():
    model = make_model()
    bal = build(model, group="all_matrix")
    train_ours(model, bal, 2)
    saved_model, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(bal.state_dict())
    assert saved["weighting.targets"].shape == (4, 3, 3)
    train_ours(model, bal, 2)
    again_model = make_model(seed=2)
    again_model.load_state_dict(saved_model)
    again = build(again_model, group="all_matrix", seed=99)
    again.load_state_dict(saved)
    train_ours(again_model, again, 2)
    assert_same_parameters(again_model, model, rtol=0, atol=0)
    before = bal.weighting.targets.clone()
    x, y = batch()
    out, losses = task_losses(model, x, y)
    bal.backward(losses, out.shared, BackwardContext())
    bal.step(torch.tensor(True))
    assert torch.equal(bal.weighting.targets, before)


def test_bad_options_fail_clearly():
    model = make_model()
    with pytest.raises(ValueError, match="^beta"):
        build(model, beta=1.5)
    with pytest.raises(ValueError, match="^group"):
        build(model, group="all_layer")
