"""`BackwardContext.measure`: a step whose measurements the loop will not read may leave out work done only for
them (a Gramian, a norm pass), never change the update."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import DualBalancing, ExcessMTL, MoCo, TrimmedMean, UPGrad
from mtl_bench.catalog import config_options
from mtl_bench.engine.checkpoint import CHECKPOINT_NAME
from mtl_bench.engine.recipe import train
from mtl_bench.gradient_engine.balancer import BackwardContext

from .test_zoo import EXTRA, SHORT, TASK_SETS


def final_state(compose_cfg, run_dir, balancer: str, log_every: int) -> dict[str, object]:
    overrides = [f"balancer={balancer}", *TASK_SETS["toy10"], *SHORT, *EXTRA.get(balancer, [])]
    train(compose_cfg(*overrides, f"trainer.log_every={log_every}"), run_dir)
    state = torch.load(run_dir / "checkpoints" / CHECKPOINT_NAME, weights_only=True)
    return {"model": state["model"], "balancer": state["balancer"]}


def assert_same(a: object, b: object, key: str) -> None:
    if isinstance(a, dict):  # a balancer's extra state (a generator's)
        assert isinstance(b, dict) and a.keys() == b.keys(), key
        for k in a:
            assert_same(a[k], b[k], f"{key}.{k}")
    else:
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, key


def assert_same_run(compose_cfg, tmp_path, balancer: str) -> None:
    every_step = final_state(compose_cfg, tmp_path / "every", balancer, 1)
    some_steps = final_state(compose_cfg, tmp_path / "some", balancer, 3)
    assert_same(every_step, some_steps, balancer)


@pytest.mark.parametrize("balancer", config_options()["balancer"])
def test_logging_every_step_or_every_third_trains_the_same_parameters(compose_cfg, tmp_path, balancer):
    assert_same_run(compose_cfg, tmp_path, balancer)


def make_step(cls, measure: bool, **options):
    torch.manual_seed(0)
    trunk = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    heads = torch.nn.ModuleList(torch.nn.Linear(8, 1) for _ in range(3))
    balancer = cls(["a", "b", "c"], list(trunk.parameters()), **options)
    x, y = torch.randn(16, 6), torch.randn(3, 16, 1)
    ctx = BackwardContext(measure=measure)

    def step() -> dict[str, torch.Tensor]:
        for p in [*trunk.parameters(), *heads.parameters()]:
            p.grad = None
        shared = trunk(x)
        losses = {n: torch.nn.functional.mse_loss(h(shared), y[i]) for i, (n, h) in enumerate(zip("abc", heads))}
        metrics = balancer.backward(losses, shared, ctx)
        balancer.step(False)
        return metrics

    return trunk, balancer, step, ctx


@pytest.mark.parametrize("cls", [TrimmedMean, ExcessMTL, DualBalancing, MoCo, UPGrad])
def test_a_step_that_is_not_measured_leaves_out_the_gradient_statistics_only(cls):
    trunk_m, balancer_m, measured, _ = make_step(cls, True)
    trunk_u, balancer_u, unmeasured, _ = make_step(cls, False)
    for _ in range(3):
        full, short = measured(), unmeasured()
        for p, q in zip(trunk_m.parameters(), trunk_u.parameters()):
            assert torch.equal(p.grad, q.grad)
    assert {f"grad_norm/{n}" for n in "abc"} <= full.keys()
    assert not any(k.startswith(("grad_norm/", "grad_cos/")) for k in short)
    assert {f"weight/{n}" for n in "abc"} <= short.keys()  # cheap and read by the loop: always there
    assert all(torch.equal(full[k], v) for k, v in short.items())
    for key, value in balancer_m.state_dict().items():
        assert torch.equal(value, balancer_u.state_dict()[key]), key


def test_the_loop_measures_at_its_logging_steps(compose_cfg, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    final_state(compose_cfg, tmp_path, "trimmed_mean", 3)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    norms = [f"grad_norm/t{i}" for i in range(10)]  # toy10's tasks
    assert all([e.step for e in events.Scalars(tag)] == [3, 6] for tag in norms)


@pytest.mark.parametrize(
    ("cls", "options"), [(ExcessMTL, {}), (ExcessMTL, {"warmup_steps": 3}), (DualBalancing, {}), (MoCo, {})]
)
def test_a_non_finite_gradient_stays_out_of_the_state_of_a_step_that_is_not_measured(cls, options):
    _, balancer, step, ctx = make_step(cls, False, **options)
    step()
    before = {k: v.clone() for k, v in balancer.state_dict().items()}
    ctx.factor = float("inf")  # the scaled gradients are not finite, the losses are (an fp16 overflow)
    step()  # committed as kept (step(False)): only the balancer's own finiteness check keeps the state
    for key, value in balancer.state_dict().items():
        assert torch.equal(value, before[key]), key
