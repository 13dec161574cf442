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


class RowMean(Mean):
    """`Mean` that also takes J row by row, building its running sum of the rows in a kept spare; says which it got."""

    def __init__(self, shapes) -> None:
        super().__init__()
        self.got: list[str] = []
        for k, shape in enumerate(shapes):
            self.register_buffer(f"total_{k}", torch.zeros(shape))

    def forward(self, blocks, scale, losses):
        self.got.append("blocks")
        return self.forward_rows(iter([[b[i] for b in blocks] for i in range(blocks[0].shape[0])]), scale, losses)

    def forward_rows(self, rows, scale, losses):
        self.got.append("rows")
        sums = None
        for row in rows:
            sums = list(row) if sums is None else [s + g for s, g in zip(sums, row)]
        new = [
            torch.add(getattr(self, f"total_{k}"), s, out=self.staging_buffer(f"total_{k}", s))
            for k, s in enumerate(sums)
        ]
        state = {"steps": self.steps + 1, **{f"total_{k}": v for k, v in enumerate(new)}}
        t = len(losses)
        solution = Solution(torch.full((t,), 1 / t), state=state)
        return Aggregation([s / t for s in sums], solution, stats=[losses, torch.stack([s.norm() for s in sums])])


def row_mean_balancer(model):
    params = list(model.trunk.parameters())
    return AggregatorBalancer(TASKS3, params, RowMean([p.shape for p in params]))


def test_forward_rows_streams_one_joint_batch_and_blocks_come_elsewhere_with_the_same_gradients():
    model = make_model()
    x, y = batch()
    grads = []
    for micro, per_task in [(1, False), (2, False), (1, True)]:
        bal = row_mean_balancer(model)
        model.zero_grad()
        ctx = BackwardContext(accumulation_steps=micro, factor=1 / micro)
        for _ in range(micro):
            out, losses = task_losses(model, x, y)
            if per_task:
                for task in TASKS3:
                    out, losses = task_losses(model, x, y)
                    bal.backward_task(task, losses[task], out.shared, ctx)
            else:
                metrics = bal.backward(losses, out.shared, ctx)
        bal.step(False)
        grads.append([p.grad.clone() for p in model.parameters()])
        assert bal.aggregator.got == (["rows"] if micro == 1 and not per_task else ["blocks", "rows"])
    assert "grad_cos/a/b" in metrics  # measured from the streamed rows too
    for other in grads[1:]:
        for g, h in zip(grads[0], other):
            torch.testing.assert_close(g, h, rtol=1e-6, atol=1e-7)


def test_a_staged_spare_trades_places_with_its_buffer_and_non_finite_stats_keep_the_state():
    model = make_model()
    bal = row_mean_balancer(model)
    out, losses = task_losses(model, *batch())
    bal.backward(losses, out.shared, BackwardContext())
    spare = bal.aggregator._spares["total_0"]
    bal.step(False)
    assert bal.aggregator.total_0 is spare and bal.aggregator.steps.item() == 1  # no copy: the spare is the state
    before = {k: v.clone() for k, v in bal.state_dict().items()}
    out, losses = task_losses(model, *batch(seed=2))
    bal.backward(losses, out.shared, BackwardContext(factor=float("inf")))  # the gradients overflow
    bal.step(False)  # a step taken, but the stats are not finite: the state stays
    assert all(torch.equal(v, before[k]) for k, v in bal.state_dict().items())


def test_forward_rows_that_leaves_rows_unread_is_one_line():
    class FirstRowOnly(Aggregator):
        def forward_rows(self, rows, scale, losses):
            first = next(rows)
            return Aggregation([g.clone() for g in first], Solution(torch.ones(3)))

    model = make_model()
    bal = AggregatorBalancer(TASKS3, list(model.trunk.parameters()), FirstRowOnly())
    out, losses = task_losses(model, *batch())
    with pytest.raises(ContractError, match=r"forward_rows read 1 of 3 rows; the contract: every row") as err:
        bal.backward(losses, out.shared)
    assert "\n" not in str(err.value)


def test_forward_rows_that_reads_no_row_after_a_step_that_read_them_all_is_one_line():
    class OnceOnly(Aggregator):
        def forward_rows(self, rows, scale, losses):
            sums = [sum(pieces) for pieces in zip(*rows)] if not hasattr(self, "done") else []
            self.done = True
            return Aggregation(sums, Solution(torch.ones(3)))

    model = make_model()
    bal = AggregatorBalancer(TASKS3, list(model.trunk.parameters()), OnceOnly())
    out, losses = task_losses(model, *batch())
    bal.backward(losses, out.shared)  # all three rows read, committed at once (no context)
    out, losses = task_losses(model, *batch(seed=2))
    with pytest.raises(ContractError, match=r"forward_rows read 0 of 3 rows"):
        bal.backward(losses, out.shared)


def test_a_checkpoint_with_the_aggregators_state_under_flat_names_is_refused_in_one_line():
    model = make_model()
    bal = AggregatorBalancer(TASKS3, list(model.trunk.parameters()), Mean())
    for flat in [{"steps": torch.tensor(1)}, {"rng._extra_state": {}}]:  # a buffer, a generator that moved
        with pytest.raises(ContractError, match=r"the aggregator's state under flat names .*start a new run") as err:
            bal.load_state_dict(flat)
        assert "\n" not in str(err.value)


def test_an_aggregator_that_reads_the_representation_needs_shared_rep():
    class Signs(Aggregator):
        reads_representation = True

    with pytest.raises(ValueError, match="^grad_source: Signs reads the shared representation; it needs shared_rep$"):
        AggregatorBalancer(TASKS3, list(make_model().trunk.parameters()), Signs())


def test_an_aggregator_that_weighs_heads_scales_each_heads_gradient_by_its_head_weight():
    class WeighedHeads(Mean):
        weighs_heads = True

        def forward(self, blocks, scale, losses):
            result = super().forward(blocks, scale, losses)
            result.solution.head_weights = torch.tensor([2.0, 3.0, 4.0])
            return result

    model, plain = make_model(), make_model()
    x, y = batch()
    for bal, m in [
        (AggregatorBalancer(TASKS3, list(model.trunk.parameters()), WeighedHeads()), model),
        (AggregatorBalancer(TASKS3, list(plain.trunk.parameters()), Mean()), plain),
    ]:
        out, losses = task_losses(m, x, y)
        bal.backward(losses, out.shared)
    for factor, task in zip([2.0, 3.0, 4.0], TASKS3):
        for p, q in zip(model.heads[task].parameters(), plain.heads[task].parameters()):
            torch.testing.assert_close(p.grad, factor * q.grad)
    for p, q in zip(model.trunk.parameters(), plain.trunk.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_the_direction_becomes_grad_without_a_copy():
    made: list[int] = []

    def recorded(result):
        made.extend(d.data_ptr() for d in result.direction)
        return result

    class KeptMean(Mean):
        def forward(self, blocks, scale, losses):
            return recorded(super().forward(blocks, scale, losses))

    class KeptRows(RowMean):
        def forward_rows(self, rows, scale, losses):
            return recorded(super().forward_rows(rows, scale, losses))

    for aggregator in [KeptMean(), KeptRows([p.shape for p in make_model().trunk.parameters()])]:  # blocks, rows
        made.clear()
        model = make_model()
        bal = AggregatorBalancer(TASKS3, list(model.trunk.parameters()), aggregator)
        out, losses = task_losses(model, *batch())
        bal.backward(losses, out.shared, BackwardContext())
        assert [p.grad.data_ptr() for p in model.trunk.parameters()] == made  # the aggregator's tensors themselves


def test_a_direction_that_is_a_view_of_a_block_or_of_the_state_is_copied_into_grad():
    class Views(Aggregator):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("kept", torch.ones(2, 4, 3))

        def forward(self, blocks, scale, losses):
            return Aggregation([self.kept[0], *(b[0] for b in blocks[1:])], Solution(torch.ones(3)))

    model = make_model()
    bal = AggregatorBalancer(TASKS3, list(model.trunk.parameters()), Views())
    out, losses = task_losses(model, *batch())
    bal.backward(losses, out.shared)
    first, *others = model.trunk.parameters()
    assert torch.equal(first.grad, torch.ones(4, 3)) and first.grad.data_ptr() != bal.aggregator.kept.data_ptr()
    first.grad.add_(1)  # .grad is its own: the state stays
    assert torch.equal(bal.aggregator.kept, torch.ones(2, 4, 3))
    assert all(
        p.grad.untyped_storage().data_ptr() != b.untyped_storage().data_ptr() for p, b in zip(others, bal._spare[1:])
    )


class LogMean(RowMean):
    """`RowMean` of the gradients of log(L_i), recording what it was told of each step and the losses it got."""

    reads_step = True
    measures_gradients = True

    def __init__(self, shapes) -> None:
        super().__init__(shapes)
        self.told: list[tuple[int, bool]] = []
        self.losses: list[torch.Tensor] = []

    def objective(self, loss):
        return torch.log(loss)

    def forward(self, blocks, scale, losses, step):
        self.told.append((step.micro_batches, step.measure))
        self.losses.append(losses)
        return super().forward(blocks, scale, losses)

    def forward_rows(self, rows, scale, losses, step=None):
        if step is not None:  # from the engine, not from forward
            self.told.append((step.micro_batches, step.measure))
            self.losses.append(losses)
        return super().forward_rows(rows, scale, losses)


def test_an_aggregators_objective_is_what_the_engine_differentiates_and_it_is_told_the_step():
    x, y = batch()
    reference = make_model()
    out, losses = task_losses(reference, x, y)
    torch.autograd.backward([torch.log(losses[t]) for t in TASKS3])  # the heads': ∇log L_i (the trunk: the mean)
    for micro, per_task, measure in [(1, False, True), (2, False, False), (2, True, True)]:
        model = make_model()
        params = list(model.trunk.parameters())
        bal = AggregatorBalancer(TASKS3, params, LogMean([p.shape for p in params]))
        ctx = BackwardContext(accumulation_steps=micro, factor=1 / micro, measure=measure)
        for _ in range(micro):
            if per_task:
                for task in TASKS3:
                    out, losses = task_losses(model, x, y)
                    metrics = bal.backward_task(task, losses[task], out.shared, ctx)
            else:
                out, losses = task_losses(model, x, y)
                metrics = bal.backward(losses, out.shared, ctx)
        bal.step(False)
        assert bal.aggregator.told == [(micro, measure)]  # k backwards summed in the blocks; rows: one
        expected_losses = torch.stack([torch.log(losses[t]).detach() for t in TASKS3])
        torch.testing.assert_close(bal.aggregator.losses[0], expected_losses)  # the objectives' values
        assert not any(k.startswith(("grad_norm/", "grad_cos/")) for k in metrics)  # it measures its own
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            expected = q.grad / 3 if name.startswith("trunk.") else q.grad  # Mean's direction; heads weight 1
            torch.testing.assert_close(p.grad, expected, rtol=1e-5, atol=1e-7, msg=f"{micro} {per_task} {name}")


def test_a_backward_past_the_kth_micro_batch_and_a_step_before_it_are_one_line_each():
    model = make_model()
    bal = AggregatorBalancer(TASKS3, list(model.trunk.parameters()), Mean())
    ctx = BackwardContext(accumulation_steps=2, factor=0.5)
    for _ in range(2):
        out, losses = task_losses(model, *batch())
        bal.backward(losses, out.shared, ctx)
    out, losses = task_losses(model, *batch())
    with pytest.raises(RuntimeError, match=r"^AggregatorBalancer: the previous step's update is still pending"):
        bal.backward(losses, out.shared, ctx)  # the loop forgot balancer.step()
    bal.backward(losses, out.shared, ctx)  # refused and reset: a new step starts
    with pytest.raises(RuntimeError, match=r"step\(\) after 1 of 2 backwards \(accumulated\); the update was dropped$"):
        bal.step()
