"""The per-step Dirichlet preference of COSMOS and PBI (balancers/preference.py): the draws' distribution, the
seed's stream, resume, skipped steps, accumulation, DDP, the logged `preference/<task>`, the option checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mtl_bench.balancers import COSMOS, BackwardContext, PenaltyBoundaryIntersection
from mtl_bench.engine.recipe import train
from mtl_bench.models.base import MultiTaskModel
from tests.helpers.balancer_kit import (
    TASKS,
    TASKS3,
    assert_ddp_is_one_process_on_the_whole_batch,
    assert_resume_continues,
    metrics_without_host_sync,
    pair_losses,
    pair_model,
)

CLASSES = {"cosmos": COSMOS, "pbi": PenaltyBoundaryIntersection}


def drawn(bal, steps: int, tasks=TASKS3) -> torch.Tensor:
    """The r of `steps` plain-loop steps on constant losses, (steps, T) in `tasks` order, read from the metrics."""
    rows = []
    for _ in range(steps):
        shared = torch.zeros(1, requires_grad=True)
        losses = {t: (1.0 + i + shared).sum() for i, t in enumerate(tasks)}
        metrics = bal.backward(losses, shared)
        rows.append(torch.stack([metrics[f"preference/{t}"] for t in tasks]))
    return torch.stack(rows)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_draws_have_the_dirichlet_mean_and_variance(name):
    """E[r_i] = a_i/a0 and Var[r_i] = a_i(a0 − a_i)/(a0²(a0 + 1)): the variance tells alpha from a multiple of it."""
    alpha = torch.tensor([0.5, 2.0, 1.5])
    bal = CLASSES[name](list(TASKS3), preference="dirichlet", alpha=dict(zip(TASKS3, alpha.tolist())), seed=7)
    r = drawn(bal, 4000)
    assert torch.allclose(r.sum(dim=1), torch.ones(4000))
    assert (r >= 0).all()
    a0 = alpha.sum()
    torch.testing.assert_close(r.mean(dim=0), alpha / a0, rtol=0, atol=0.015)
    torch.testing.assert_close(r.var(dim=0), alpha * (a0 - alpha) / (a0**2 * (a0 + 1)), rtol=0.12, atol=0)


@pytest.mark.parametrize(("name", "alpha"), [("cosmos", 1.2), ("pbi", 1.0)])
def test_default_concentration_is_the_methods(name, alpha):
    """COSMOS: 1.2 for every task (its code's default); PBI: 1 (uniform on the simplex): Var = (T−1)/(T²(Tα+1))."""
    r = drawn(CLASSES[name](list(TASKS3), preference="dirichlet"), 4000)
    torch.testing.assert_close(r.mean(dim=0), torch.full((3,), 1 / 3), rtol=0, atol=0.015)
    torch.testing.assert_close(r.var(dim=0), torch.full((3,), 2 / (9 * (3 * alpha + 1))), rtol=0.12, atol=0)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_same_seed_same_draws_whatever_the_task_order(name):
    first = drawn(CLASSES[name](list(TASKS3), preference="dirichlet", seed=3), 5)
    again = drawn(CLASSES[name](["c", "a", "b"], preference="dirichlet", seed=3), 5)
    other = drawn(CLASSES[name](list(TASKS3), preference="dirichlet", seed=4), 5)
    assert torch.equal(first, again)
    assert not torch.isclose(first, other).any()
    assert all(not torch.equal(first[0], row) for row in first[1:])  # a new r every step


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_resume_continues_the_uninterrupted_stream(name):
    saved, straight = assert_resume_continues(
        lambda model: CLASSES[name](list(TASKS), preference="dirichlet", seed=5),
        range(3),
        range(3, 6),
        remake=lambda model: CLASSES[name](list(TASKS), preference="dirichlet", seed=99),
    )  # the stream comes from the state, not the new seed
    assert {"weighting.preference.pref", "weighting.preference.rng._extra_state"} <= set(saved)
    assert {f"preference/{t}" for t in TASKS} <= set(straight[0])


def test_a_skipped_step_keeps_the_preference_for_its_retry():
    model, bal = pair_model(), COSMOS(list(TASKS), preference="dirichlet", seed=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out, losses = pair_losses(model, 0)
    first = bal.backward(losses, out.shared, scaler)
    model.heads["a"].bias.grad.fill_(float("inf"))  # the scaler skips this step
    scaler.step(opt)
    scaler.update()
    bal.step()
    opt.zero_grad()
    out, losses = pair_losses(model, 0)
    retry = bal.backward(losses, out.shared, scaler)
    scaler.step(opt)
    scaler.update()
    bal.step()
    assert all(torch.equal(first[f"preference/{t}"], retry[f"preference/{t}"]) for t in TASKS)
    out, losses = pair_losses(model, 1)
    after = bal.backward(losses, out.shared, scaler)
    assert not torch.equal(after["preference/a"], first["preference/a"])


def test_accumulated_micro_batches_share_one_draw_per_step():
    expected = drawn(COSMOS(list(TASKS), preference="dirichlet", seed=6), 3, TASKS)
    model, bal = pair_model(), COSMOS(list(TASKS), preference="dirichlet", seed=6)
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    for step in range(3):
        for _ in range(2):
            out, losses = pair_losses(model, step)
            metrics = bal.backward(losses, out.shared, ctx)
            assert torch.equal(torch.stack([metrics[f"preference/{t}"] for t in TASKS]), expected[step])
        bal.step()


def test_accumulated_micro_batches_are_weighted_by_their_own_losses():
    """The draw is no statistic of the losses: each micro-batch gets COSMOS's weights of its own losses at the step's r
    (as with a fixed r), not those of the step's mean so far."""
    bal = COSMOS(list(TASKS), lambda_=2.0, preference="dirichlet", seed=6)
    assert bal.stateful and not COSMOS(list(TASKS)).stateful  # a fixed r has no update
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    for values in ((1.0, 2.0), (5.0, 3.0)):
        shared = torch.zeros(1, requires_grad=True)
        metrics = bal.backward({t: (v + shared).sum() for t, v in zip(TASKS, values)}, shared, ctx)
        r, losses = torch.stack([metrics[f"preference/{t}"] for t in TASKS]), torch.tensor(values)
        cos = (r @ losses) / (r.norm() * losses.norm())
        expected = r - 2.0 * (r / (r.norm() * losses.norm()) - cos * losses / losses.norm() ** 2)
        torch.testing.assert_close(torch.stack([metrics[f"weight/{t}"] for t in TASKS]), expected)
    bal.step()


def test_a_fixed_preference_draws_nothing_and_logs_no_preference():
    bal = COSMOS(list(TASKS3), preference={"a": 0.2, "b": 0.3, "c": 0.5})
    shared = torch.zeros(1, requires_grad=True)
    metrics = bal.backward({t: (1.0 + shared).sum() for t in TASKS3}, shared)
    assert set(metrics) == {f"weight/{t}" for t in TASKS3}
    assert bal.weighting.preference.pref.tolist() == pytest.approx([0.2, 0.3, 0.5])


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_no_host_sync_and_0d_metrics(name, monkeypatch):
    metrics = metrics_without_host_sync(CLASSES[name](list(TASKS), preference="dirichlet"), monkeypatch, False)
    assert set(metrics) == {f"{family}/{t}" for family in ("weight", "preference") for t in TASKS}


def DDP_BALANCER(names: list[str], model: MultiTaskModel):  # noqa: N802 (read by the spawned workers)
    return COSMOS(names, lambda_=2.0, preference="dirichlet", seed=3)


@pytest.mark.slow  # two spawned processes: about 25 s on 2 shared cores
def test_ddp_ranks_draw_the_same_preference_as_one_process(tmp_path: Path):
    """Rank 1 lists its tasks in reverse: the draws still agree, and equal one process's on the whole batch."""
    assert_ddp_is_one_process_on_the_whole_batch(tmp_path, DDP_BALANCER, 3)


SHORT = ["trainer=smoke", "trainer.max_steps=6", "trainer.log_every=3", "trainer.eval_every=6"]
TOY = ["tasks=toy10", "tasks.n_train=256", "tasks.n_val=32", "tasks.n_test=32", "model.widths=[32,32]"]


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_engine_logs_the_drawn_preference(compose_cfg, tmp_path, name):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = compose_cfg(f"balancer={name}", "balancer.preference=dirichlet", "balancer.alpha=0.5", *TOY, *SHORT)
    train(cfg, tmp_path)
    tasks = json.loads((tmp_path / "metrics.json").read_text())["test"]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    logged = torch.tensor([[e.value for e in events.Scalars(f"preference/{t}")] for t in tasks])
    assert logged.shape == (len(tasks), 2)  # steps 3 and 6
    torch.testing.assert_close(logged.sum(dim=0), torch.ones(2))
    assert not torch.equal(logged[:, 0], logged[:, 1])


def test_a_resumed_run_ends_with_the_numbers_of_an_uninterrupted_one(compose_cfg, tmp_path):
    """The checkpoint carries the generator: the resumed run draws the uninterrupted run's r at steps 4-6."""
    args = ["balancer=cosmos", "balancer.preference=dirichlet", "balancer.lambda_=2.0", *TOY, *SHORT]
    straight = train(compose_cfg(*args), tmp_path / "straight")
    train(compose_cfg(*args, "trainer.max_steps=3"), tmp_path / "cut")
    resumed = train(compose_cfg(*args, "trainer.resume=auto"), tmp_path / "cut")
    assert resumed.step == 6 and resumed.test == straight.test and resumed.val == straight.val


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"alpha": 2.0}, "alpha: the Dirichlet concentration needs preference: dirichlet, got 2.0"),
        ({"preference": "uniform"}, "preference: 'uniform' is not 'dirichlet', a {task: weight >= 0} or null"),
        ({"preference": "dirichlet", "alpha": 0.0}, "alpha.a: must be a finite number > 0, got 0.0"),
        ({"preference": "dirichlet", "alpha": float("inf")}, "alpha.a: must be a finite number > 0, got inf"),
        ({"preference": "dirichlet", "alpha": [1.0, 2.0]}, "alpha: must be a number > 0 or {task: number > 0}"),
        ({"preference": "dirichlet", "alpha": {"a": 1.0}}, "alpha: tasks ['a'] do not match the task set's tasks"),
        ({"preference": "dirichlet", "seed": 1.5}, "seed: must be an integer, got 1.5"),
    ],
)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_bad_options_name_their_argument(name, options, message):
    with pytest.raises(ValueError) as info:
        CLASSES[name](list(TASKS), **options)
    assert str(info.value).startswith(message)
