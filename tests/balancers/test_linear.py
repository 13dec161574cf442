"""Linear scalarization: the weights are the preference (fixed, or the step's draw), and the network trains as on
PHN's `LinearScalarizationSolver` objective (losses * ray).sum() with the same rays."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import LinearScalarization
from tests.helpers.balancer_kit import TASKS3, assert_same_parameters, batch, make_model, task_losses, train_ours


def test_weights_are_the_preference():
    shared = torch.zeros(1, requires_grad=True)
    bal = LinearScalarization(list(TASKS3), preference={"a": 0.2, "b": 0.3, "c": 0.5})
    metrics = bal.backward({t: (v + shared).sum() for t, v in zip(TASKS3, (3.0, 4.0, 1.0))}, shared)
    assert [metrics[f"weight/{t}"].item() for t in TASKS3] == pytest.approx([0.2, 0.3, 0.5])
    assert shared.grad.item() == pytest.approx(1.0)  # d/ds of Σ r_i (L_i + s)


def test_a_drawn_preference_trains_as_the_weighted_sum_with_that_ray():
    ours, reference = make_model(), make_model()
    history = train_ours(ours, LinearScalarization(list(TASKS3), preference="dirichlet", seed=3), 5)
    rays = [torch.stack([m[f"preference/{t}"] for t in TASKS3]) for m in history]
    assert all(torch.equal(torch.stack([m[f"weight/{t}"] for t in TASKS3]), r) for m, r in zip(history, rays))
    assert len({tuple(r.tolist()) for r in rays}) == 5  # a new ray each step
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step, ray in enumerate(rays):  # PHN's loop: loss = (losses * ray).sum() with the step's ray
        x, y = batch(TASKS3, seed=step)
        opt.zero_grad()
        _, losses = task_losses(reference, x, y)
        (torch.stack([losses[t] for t in TASKS3]) * ray).sum().backward()
        opt.step()
    assert_same_parameters(ours, reference)
