"""The aggregator contract (balancers/aggregator.py) run by AggregatorBalancer: a user's aggregator in a few lines
writes its direction into `.grad`, stages its state until the step is taken, and a broken result is one line."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import Aggregation, Aggregator, BackwardContext, Solution
from mtl_bench.errors import ContractError
from mtl_bench.gradient_engine.aggregator_balancer import AggregatorBalancer
from tests.helpers.balancer_kit import TASKS3, batch, make_model, task_losses


class Mean(Aggregator):
    """The plain mean of the task gradients, counting its steps in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, blocks, scale, losses):
        t = blocks[0].shape[0]
        return Aggregation(
            [b.mean(0) for b in blocks], Solution(torch.full((t,), 1 / t), state={"steps": self.steps + 1})
        )


def trunk_grads(model, losses) -> list[torch.Tensor]:
    return [torch.autograd.grad(losses[t], list(model.trunk.parameters()), retain_graph=True) for t in TASKS3]


def test_the_direction_is_the_aggregators_and_its_state_waits_for_the_step():
    model = make_model()
    bal = AggregatorBalancer(TASKS3, list(model.trunk.parameters()), Mean())
    out, losses = task_losses(model, *batch())
    expected = [sum(g[k] for g in trunk_grads(model, losses)) / 3 for k in range(4)]
    metrics = bal.backward(losses, out.shared, BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=8.0)))
    for p, e in zip(model.trunk.parameters(), expected):
        torch.testing.assert_close(p.grad / 8, e, rtol=1e-5, atol=1e-7)  # written as the blocks are: scaled
    assert metrics["weight/a"].item() == pytest.approx(1 / 3) and "grad_norm/a" in metrics
    assert bal.aggregator.steps.item() == 0  # staged
    bal.step(False)
    assert bal.aggregator.steps.item() == 1 and set(bal.state_dict()) == {"aggregator.steps"}
    out, losses = task_losses(model, *batch(seed=2))
    bal.backward(losses, out.shared, BackwardContext())
    bal.step(torch.tensor(True))  # skipped: the state stays
    assert bal.aggregator.steps.item() == 1


def test_a_result_without_one_direction_per_block_is_one_line():
    class Broken(Aggregator):
        def forward(self, blocks, scale, losses):
            return Aggregation(blocks[:1], Solution(torch.ones(3)))

    model = make_model()
    bal = AggregatorBalancer(TASKS3, list(model.trunk.parameters()), Broken())
    out, losses = task_losses(model, *batch())
    with pytest.raises(ContractError, match=r"an Aggregation with one direction per block \(4\)") as err:
        bal.backward(losses, out.shared)
    assert "\n" not in str(err.value)
