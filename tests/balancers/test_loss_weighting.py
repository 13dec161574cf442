"""The loss-weighting contract (balancers/loss_weighting.py) run by LossWeightingBalancer: the backward of
Σ_i w_i L_i through the loss scale, state staged until the step is taken, per-task steps for a per_task weighting."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import BackwardContext, LossWeighting, Solution
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer, objective_weights
from tests.helpers.balancer_kit import TASKS3, batch, make_model, task_losses


class InverseLoss(LossWeighting):
    """w_i = 1 / L_i (the weight of L_i from L_i alone), counting its steps."""

    per_task = True

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, losses):
        return Solution(1 / losses, metrics={"inverse/mean": (1 / losses).mean()}, state={"steps": self.steps + 1})


def test_the_gradient_is_the_weighted_sums_and_the_state_waits_for_the_step():
    model, reference = make_model(), make_model()
    x, y = batch()
    out, losses = task_losses(model, x, y)
    bal = LossWeightingBalancer(["c", "a", "b"], InverseLoss())
    metrics = bal.backward(losses, out.shared, BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=4.0)))
    _, ref_losses = task_losses(reference, x, y)
    sum(ref_losses[t] / ref_losses[t].detach() for t in TASKS3).backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad / 4, q.grad, rtol=1e-5, atol=1e-7)
    assert metrics["weight/b"].item() == pytest.approx(1 / losses["b"].item(), rel=1e-6)
    assert "inverse/mean" in metrics and bal.weighting.steps.item() == 0
    bal.step(False)
    assert bal.weighting.steps.item() == 1 and set(bal.state_dict()) == {"weighting.steps"}


def test_a_per_task_weighting_runs_per_task_steps_and_the_others_refuse():
    model = make_model()
    out, losses = task_losses(model, *batch())
    bal = LossWeightingBalancer(TASKS3, InverseLoss())
    assert bal.per_task_problem() is None
    metrics = bal.backward_task("b", losses["b"], out.shared)
    assert metrics["weight/b"].item() == pytest.approx(1 / losses["b"].item(), rel=1e-6)

    class Mean(LossWeighting):
        def forward(self, losses):
            return objective_weights(lambda at: at.mean(), losses)

    plain = LossWeightingBalancer(TASKS3, Mean())
    assert "has no per-task mode" in plain.per_task_problem()
    with pytest.raises(NotImplementedError, match="trainer.step_mode=joint"):
        plain.backward_task("a", losses["a"], out.shared)
