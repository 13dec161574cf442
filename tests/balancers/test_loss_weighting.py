"""The loss-weighting contract (balancers/loss_weighting.py) run by LossWeightingBalancer: the backward of
Σ_i w_i L_i through the loss scale, state staged until the step is taken, per-task steps for a per_task weighting,
and an on_graph weighting's gradients of the step's own losses, its state from its Solution and its own objective."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import BackwardContext, LossWeighting, Solution
from mtl_bench.balancers.loss_weighting import GraphSolution
from mtl_bench.errors import ContractError
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer, objective_weights
from mtl_bench.gradient_engine.staged import scaled_grad
from tests.helpers.balancer_kit import TASKS3, batch, make_model, task_losses


class InverseLoss(LossWeighting):
    """w_i = 1 / L_i (the weight of L_i from L_i alone), counting its steps."""

    per_task = True

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, losses):
        return Solution(1 / losses, metrics={"inverse/mean": (1 / losses).mean()})

    def update(self, losses, items):
        return {"steps": self.steps + 1}


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


class LastLosses(LossWeighting):
    """w = 1; its state is the losses its update saw, and how many updates it had."""

    per_task = True

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(3))
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))

    def forward(self, losses):
        return torch.ones_like(losses)

    def update(self, losses, items):
        return {"seen": losses, "updates": self.updates + 1}


def constant(values, items):
    shared = torch.zeros(items, requires_grad=True)
    return {t: v + shared.sum() for t, v in zip(TASKS3, values)}, shared


def test_the_update_runs_once_a_step_on_the_item_weighted_mean_of_its_micro_batches():
    bal = LossWeightingBalancer(TASKS3, LastLosses())
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    for values, items in (((1.0, 2.0, 3.0), 3), ((5.0, 6.0, 7.0), 1)):
        bal.backward(*constant(values, items), ctx)
    bal.step(False)
    torch.testing.assert_close(bal.weighting.seen, torch.tensor([2.0, 3.0, 4.0]))  # (3·1 + 1·5) / 4, ...
    assert bal.weighting.updates.item() == 1


def test_per_task_steps_update_at_the_step_from_every_task_and_a_skipped_step_keeps_the_state():
    bal = LossWeightingBalancer(TASKS3, LastLosses())
    for skipped in (False, True):
        for task, value in zip(TASKS3, (1.0, 2.0, 3.0) if not skipped else (7.0, 8.0, 9.0)):
            losses, shared = constant((value,) * 3, 2)
            assert bal.backward_task(task, losses[task], shared, BackwardContext()) == {f"weight/{task}": 1.0}
        assert bal.weighting.updates.item() == 0 if not skipped else 1
        bal.step(skipped)
    torch.testing.assert_close(bal.weighting.seen, torch.tensor([1.0, 2.0, 3.0]))
    assert bal.weighting.updates.item() == 1


class DrawnScale(LossWeighting):
    """w = s · L (s a state no loss feeds, like a drawn preference: `step_mean = False`), s doubled by each update;
    `draws=False` leaves it no state."""

    step_mean = False

    def __init__(self, draws: bool = True) -> None:
        super().__init__()
        self.draws = draws
        self.register_buffer("scale", torch.ones(()))
        self.seen = []

    @property
    def stateful(self) -> bool:
        return self.draws

    def forward(self, losses):
        self.seen.append(losses.clone())
        return self.scale * losses

    def update(self, losses, items):
        return {"scale": self.scale * 2}


def test_a_weighting_off_the_step_mean_sees_each_micro_batch_and_updates_once_a_step():
    bal = LossWeightingBalancer(TASKS3, DrawnScale())
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    for step in range(2):
        metrics = [
            bal.backward(*constant(values, items), ctx)
            for values, items in (((1.0, 2.0, 3.0), 3), ((5.0, 6.0, 7.0), 1))
        ]
        bal.step(False)
        assert metrics[1]["weight/c"].item() == 7.0 * 2**step  # its own losses, the step's scale
    torch.testing.assert_close(torch.stack(bal.weighting.seen[:2]), torch.tensor([[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]]))
    assert bal.weighting.scale.item() == 4.0


def test_a_weighting_whose_options_leave_it_no_state_runs_without_an_update():
    bal = LossWeightingBalancer(TASKS3, DrawnScale(draws=False))
    assert not bal.stateful
    bal.backward(*constant((1.0, 2.0, 3.0), 2))
    bal.step(False)
    assert bal.weighting.scale.item() == 1.0


class InverseGradNorm(LossWeighting):
    """On the graph: w_i = 1 / ‖∇_θ L_i‖ (unscaled) at `params`; its state counts the steps and keeps the last epoch
    (`poison` makes the new count NaN); `objective` backpropagates Σ_p ⟨1, p⟩ in place of Σ w_i L_i."""

    on_graph = True

    def __init__(self, params, objective: bool = False, poison: bool = False) -> None:
        super().__init__()
        self.params, self.objective, self.poison = list(params), objective, poison
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("epoch", torch.zeros(()))
        self.scales = []

    def forward(self, losses, scale=None, epoch=0):
        self.scales.append(scale)
        norms = []
        for loss in losses:
            grads = scaled_grad(loss, self.params, scale, retain_graph=True, allow_unused=True)
            norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads if g is not None]))
            norms.append(norm / scale if scale is not None else norm)
        state = {"steps": self.steps + (float("nan") if self.poison else 1), "epoch": torch.full((), float(epoch))}
        objective = sum((p * torch.ones_like(p)).sum() for p in self.params) if self.objective else None
        solution = Solution(1 / torch.stack(norms), state=state)
        return solution if objective is None else GraphSolution(solution, objective)


def grad_norm(loss, params):
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads if g is not None]))


def test_an_on_graph_weighting_differentiates_the_step_s_own_losses_and_its_state_waits_for_the_step():
    model, reference = make_model(), make_model()
    x, y = batch()
    out, losses = task_losses(model, x, y)
    weighting = InverseGradNorm(model.parameters())
    bal = LossWeightingBalancer(["c", "a", "b"], weighting)
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=4.0), factor=0.5, epoch=3)
    metrics = bal.backward(losses, out.shared, ctx)
    assert weighting.scales[0].item() == 4.0  # the grad scaler's scale, without the backward's factor
    _, ref_losses = task_losses(reference, x, y)
    params = list(reference.parameters())
    weights = {t: 1 / grad_norm(ref_losses[t], params) for t in TASKS3}
    (0.5 * sum(weights[t].detach() * ref_losses[t] for t in TASKS3)).backward()
    for p, q in zip(model.parameters(), params):
        torch.testing.assert_close(p.grad / 4, q.grad, rtol=1e-5, atol=1e-7)
    for t in TASKS3:
        assert metrics[f"weight/{t}"].item() == pytest.approx(weights[t].item(), rel=1e-5)
    assert weighting.steps.item() == 0
    bal.step(False)
    assert (weighting.steps.item(), weighting.epoch.item()) == (1, 3)
    assert set(bal.state_dict()) == {"weighting.steps", "weighting.epoch"}
    out, losses = task_losses(model, x, y)
    bal.backward(losses, out.shared, BackwardContext(epoch=4))
    bal.step(True)  # skipped: the state stays
    assert (weighting.steps.item(), weighting.epoch.item()) == (1, 3)


def test_an_on_graph_weighting_s_objective_replaces_the_weighted_sum_and_a_non_finite_state_is_not_kept():
    model = make_model()
    out, losses = task_losses(model, *batch())
    bal = LossWeightingBalancer(TASKS3, InverseGradNorm(model.parameters(), objective=True, poison=True))
    metrics = bal.backward(losses, out.shared)  # without a context: committed at once
    for p in model.parameters():
        torch.testing.assert_close(p.grad, torch.ones_like(p))
    assert set(metrics) == {"weight/a", "weight/b", "weight/c"}
    assert bal.weighting.steps.item() == 0 and bal.weighting.epoch.item() == 0


def test_an_on_graph_weighting_runs_joint_steps_and_has_no_update():
    model = make_model()
    bal = LossWeightingBalancer(TASKS3, InverseGradNorm(model.parameters()))
    assert "LossWeightingBalancer has no per-task mode" in bal.per_task_problem()

    class WithUpdate(InverseGradNorm):
        def update(self, losses, items):
            return {}

    with pytest.raises(ContractError, match="^WithUpdate: an on_graph weighting returns its new state in its forward"):
        LossWeightingBalancer(TASKS3, WithUpdate(model.parameters()))
