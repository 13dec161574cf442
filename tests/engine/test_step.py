"""Seed 001's multi-batch processor: joint and per-task steps, gradient accumulation (trainer.step_mode,
trainer.grad_accumulation_steps). The seed asks whether the gradient at the step is the sum of the
per-batch gradients: these tests answer with numbers."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from mtl_bench.balancers import FixedWeights, GradNorm
from mtl_bench.engine.builders import build
from mtl_bench.engine.data import StepSampler
from mtl_bench.engine.precision import Precision
from mtl_bench.engine.recipe import train
from mtl_bench.engine.step import StepRunner


def setup(conf):
    torch.manual_seed(0)
    taskset = build("tasks", conf.tasks)
    model = build(
        "model", conf.model, input_shape=taskset.input_shape, heads={t.name: t.out_dim for t in taskset.tasks}
    )
    return taskset, model


def grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def runner_grads(conf, taskset, model, balancer, step=3):
    precision = Precision(torch.device("cpu"))
    trainer = OmegaConf.to_object(conf.trainer)
    runner = StepRunner(model, taskset, balancer, precision, trainer, conf.seed, torch.device("cpu"))
    model.zero_grad(set_to_none=True)
    out = runner.run(step)
    return grads(model), out


def manual_grad(model, taskset, task_weights, batches):
    """Σ over (task, index) of weight·∇L_task(batch) computed one backward at a time."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for task, index, weight in batches:
        model.zero_grad(set_to_none=True)
        inputs, targets = taskset.train.batch(index)
        out = model(inputs)
        t = next(t for t in taskset.tasks if t.name == task)
        (weight * t.loss(out.preds[task], targets[task])).backward()
        total = [acc + g for acc, g in zip(total, grads(model))]
    return total


def test_per_task_gradient_is_the_sum_of_the_per_task_batch_gradients(small_conf):
    conf = small_conf("trainer.step_mode=per_task", "balancer.weights={t0:1.0,t1:0.001}")
    taskset, model = setup(conf)
    got, out = runner_grads(conf, taskset, model, FixedWeights(["t0", "t1"], weights={"t0": 1.0, "t1": 0.001}))
    n, b = len(taskset.train), conf.trainer.batch_size
    # each task has its own stream: stream i+1 of the same seed
    batches = [
        (t, StepSampler(n, b, conf.seed, stream=i + 1).indices(3), w)
        for i, (t, w) in enumerate([("t0", 1.0), ("t1", 0.001)])
    ]
    assert not torch.equal(batches[0][1], batches[1][1])  # really different batches
    expected = manual_grad(model, taskset, None, batches)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["joint", "per_task"])
def test_accumulated_gradient_is_the_mean_over_micro_batches(small_conf, mode):
    conf = small_conf(f"trainer.step_mode={mode}", "trainer.grad_accumulation_steps=3")
    taskset, model = setup(conf)
    got, out = runner_grads(conf, taskset, model, FixedWeights(["t0", "t1"]), step=2)
    n, b = len(taskset.train), conf.trainer.batch_size
    streams = {"t0": 1, "t1": 2} if mode == "per_task" else {"t0": 0, "t1": 0}
    batches = [
        (t, StepSampler(n, b, conf.seed, stream=s).indices(2 * 3 + j), 1.0 / 3)
        for j in range(3)
        for t, s in streams.items()
    ]
    expected = manual_grad(model, taskset, None, batches)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-7)
    assert out.losses.shape == (2,)


def test_batch_b_with_two_micro_batches_equals_batch_2b(small_conf, tmp_path):
    one = train(small_conf("trainer.batch_size=64", "optim=sgd"), tmp_path / "one")
    two = train(small_conf("trainer.batch_size=32", "trainer.grad_accumulation_steps=2", "optim=sgd"), tmp_path / "two")
    a = torch.load(tmp_path / "one" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "two" / "checkpoints" / "last.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)
    assert one.step == two.step == 20


def test_gradnorm_updates_once_per_optimizer_step_from_mean_statistics(small_conf):
    conf = small_conf("trainer.grad_accumulation_steps=2", "balancer=gradnorm")
    taskset, model = setup(conf)
    balancer = GradNorm(["t0", "t1"], shared_layer=model.last_shared_layer, alpha=1.5, lr=0.025)
    _, out = runner_grads(conf, taskset, model, balancer, step=0)
    balancer.step(False)
    assert balancer.opt_step.item() == 1  # one weight update for two micro-batches
    # L_i(0) is the mean of the two micro-batches' losses
    torch.testing.assert_close(balancer.initial_losses, out.losses)


@pytest.mark.parametrize("balancer", ["fixed", "rescaled_norm", "gradnorm"])
@pytest.mark.parametrize("mode", ["joint", "per_task"])
def test_every_balancer_trains_in_both_modes_with_accumulation(small_conf, tmp_path, balancer, mode):
    result = train(
        small_conf(
            f"balancer={balancer}",
            f"trainer.step_mode={mode}",
            "trainer.grad_accumulation_steps=2",
            "trainer.max_steps=30",
            "optim.lr=0.003",
        ),
        tmp_path,
    )
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert state["scheduler"]["last_epoch"] == 30  # the schedule counts optimizer steps
    if balancer == "gradnorm":
        assert state["balancer"]["opt_step"].item() == 30
    assert sum(v["loss"] for v in result.test.values()) < sum(v["loss"] for v in result.initial_test.values())


def test_per_task_mode_on_digits_with_lenet(compose_cfg, tmp_path):
    conf = compose_cfg(
        "trainer=smoke", "tasks=digits", "model=lenet", "trainer.step_mode=per_task", "balancer=gradnorm"
    )
    result = train(conf, tmp_path)
    assert set(result.test) == {"left", "right", "sum"} and result.step == 20


class RecordsWhatItSees(FixedWeights):
    """A bilevel balancer's view of the loop: what its validation source and the context hand it each step."""

    def __init__(self, task_names, validation=None):
        super().__init__(task_names)
        self.validation = validation
        self.seen: list[dict] = []

    def backward(self, losses, shared, ctx=None):
        source = self.validation
        inputs, targets = source.training_batch()
        val_inputs, val_targets = source.next_validation_batch()
        ahead = {name: p.detach() + 0.5 for name, p in source.trainable_parameters().items()}
        self.seen.append(
            {
                "inputs": inputs,
                "val_inputs": val_inputs,
                "val_targets": val_targets,
                "lr": source.learning_rate(),
                "epoch": ctx.epoch,
                "same": source.task_losses(inputs, targets),
                "ahead": source.task_losses(val_inputs, val_targets, ahead),
                "ahead_params": ahead,
                "losses": {k: v.detach() for k, v in losses.items()},
            }
        )
        return super().backward(losses, shared, ctx)


def bilevel_runner(conf, source: str = "holdout"):
    from mtl_bench.engine.compose import build_parts

    conf = OmegaConf.merge(conf, {"trainer": {"validation_source": source}})
    trainer = OmegaConf.to_object(conf.trainer)
    torch.manual_seed(0)
    parts = build_parts(conf, trainer, torch.device("cpu"))
    balancer = RecordsWhatItSees(parts.taskset.task_names, parts.validation)
    runner = StepRunner(
        parts.model,
        parts.taskset,
        balancer,
        parts.precision,
        trainer,
        conf.seed,
        torch.device("cpu"),
    )
    parts.validation.connect(runner, parts.optimizer)  # as the loop does at set-up (the stream is a callback)
    return parts, balancer, runner


def rows_of(inputs, split) -> set[int]:
    """Which rows of `split` the batch `inputs` holds (toy inputs are continuous draws: rows are unique)."""
    matches = (inputs[:, None, :] == split.inputs[None, :, :]).all(-1)
    assert (matches.sum(1) == 1).all()
    return set(matches.int().argmax(1).tolist())


def test_a_bilevel_balancer_gets_held_out_batches_the_training_stream_never_sees(small_conf):
    conf = small_conf("balancer=auto_lambda", "optim.lr=0.003")
    parts, balancer, runner = bilevel_runner(conf)
    assert len(parts.taskset.train) == 512 - 51 and len(parts.validation.data) == 51  # trainer.validation_holdout=0.1
    for step in range(4):
        runner.run(step)
    _, again, runner2 = bilevel_runner(conf)
    runner2.run(2)  # a resumed run draws the same validation batch at the same step
    torch.testing.assert_close(again.seen[0]["val_inputs"], balancer.seen[2]["val_inputs"])
    full = build("tasks", conf.tasks).train
    held, trained = set(), set()
    for seen in balancer.seen:
        assert seen["lr"] == 0.003 and seen["val_inputs"].shape[0] == conf.trainer.batch_size
        held |= rows_of(seen["val_inputs"], full)
        trained |= rows_of(seen["inputs"], full)
        torch.testing.assert_close(seen["same"], seen["losses"])  # task_losses is the step's own loss
    assert held <= rows_of(parts.validation.data.inputs, full) and not held & trained
    # with params: the model at those parameters (here every parameter + 0.5), its own left as they were
    seen = balancer.seen[-1]
    out = torch.func.functional_call(parts.model, seen["ahead_params"], (seen["val_inputs"],))
    for task in parts.taskset.tasks:
        expected = task.loss(out.preds[task.name], seen["val_targets"][task.name])
        torch.testing.assert_close(seen["ahead"][task.name], expected)


def test_the_context_carries_the_epoch_of_the_step(small_conf):
    """ctx.epoch = step // steps per epoch (461 training rows, batch 32: 14 steps), a function of the step alone."""
    _, balancer, runner = bilevel_runner(small_conf("balancer=auto_lambda"))
    assert runner.steps_per_epoch == (512 - 51) // 32 == 14
    for step in (0, 13, 14, 29, 3):
        runner.run(step)
    assert [seen["epoch"] for seen in balancer.seen] == [0, 0, 1, 2, 0]


def test_validation_source_val_draws_from_the_val_split_and_holds_nothing_out(small_conf):
    conf = small_conf("balancer=auto_lambda")
    parts, balancer, runner = bilevel_runner(conf, source="val")
    assert parts.validation is not None and len(parts.taskset.train) == 512
    runner.run(0)
    assert rows_of(balancer.seen[0]["val_inputs"], parts.taskset.val)


def test_look_ahead_forwards_leave_batchnorm_statistics_alone(small_conf):
    from torch import nn

    from mtl_bench.models.base import MultiTaskModel

    conf = small_conf("balancer=auto_lambda")
    parts, _, _ = bilevel_runner(conf)
    trunk = nn.Sequential(nn.Linear(parts.taskset.input_shape[0], 8), nn.BatchNorm1d(8), nn.ReLU())
    model = MultiTaskModel(trunk, {t.name: nn.Linear(8, t.out_dim) for t in parts.taskset.tasks}, trunk[0])
    trainer = OmegaConf.to_object(conf.trainer)
    balancer = RecordsWhatItSees(parts.taskset.task_names, parts.validation)
    runner = StepRunner(
        model,
        parts.taskset,
        balancer,
        parts.precision,
        trainer,
        conf.seed,
        torch.device("cpu"),
    )
    parts.validation.connect(runner, torch.optim.SGD(model.parameters(), lr=0.1))
    runner.run(0)  # the balancer's look-ahead forward at θ + 0.5 runs inside the step
    inputs, targets = runner.sources[0].batch(1)
    before = {name: b.clone() for name, b in model.named_buffers()}
    source = parts.validation  # connected to this runner's model
    source.task_losses(inputs, targets, {n: p + 0.1 for n, p in source.trainable_parameters().items()})
    for name, value in model.named_buffers():
        assert torch.equal(value, before[name]), name
    source.task_losses(inputs, targets)  # without params: the model itself, whose forward updates them
    assert not torch.equal(model.trunk[1].running_mean, before["trunk.1.running_mean"])
