"""RandomLossWeighting: softmax of draws from its own generator, exactness against LibMTL 1.1.5's RLW, resume, skips."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtl_bench.balancers import BackwardContext, RandomLossWeighting
from mtl_bench.errors import ContractError
from mtl_bench.models.base import MultiTaskModel
from tests.helpers.balancer_kit import (
    TASKS,
    assert_ddp_is_one_process_on_the_whole_batch,
    assert_resume_continues,
    libmtl_module,
    metrics_without_host_sync,
    pair_losses,
    pair_model,
)

# ---------------------------------------------------------------------------------------------- the formula


def test_weights_are_the_softmax_of_the_generators_normal_draws():
    g = torch.Generator().manual_seed(3)
    draws = [torch.softmax(torch.randn(2, generator=g), dim=-1) for _ in range(3)]
    bal = RandomLossWeighting(list(TASKS), seed=3)
    for draw in draws:
        shared = torch.zeros(1, requires_grad=True)
        metrics = bal.backward({"a": (2.0 * shared).sum(), "b": (5.0 * shared).sum()}, shared)
        assert [metrics[f"weight/{t}"].item() for t in TASKS] == draw.tolist()
        torch.testing.assert_close(shared.grad, 2.0 * draw[:1] + 5.0 * draw[1:])
        assert draw.sum().item() == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------- the reference


@pytest.mark.parametrize("distribution", ["normal", "uniform", "dirichlet", "bernoulli"])
def test_matches_libmtl_rlw(distribution: str):
    """LibMTL draws from the global generator: seeded like ours, both train the same parameters."""
    module = libmtl_module("RLW")
    ref_model, ref = pair_model(), module.RLW()
    ref.task_num, ref.device = len(TASKS), "cpu"
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    torch.manual_seed(11)
    ref_weights = []
    for step in range(6):
        ref_opt.zero_grad()
        _, losses = pair_losses(ref_model, step)
        ref_weights.append(ref.backward(torch.stack([losses[t] for t in TASKS]), dist=distribution.capitalize()))
        ref_opt.step()

    model, bal = pair_model(), RandomLossWeighting(list(TASKS), seed=11, distribution=distribution)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        opt.zero_grad()
        out, losses = pair_losses(model, step)
        metrics = bal.backward(losses, out.shared, BackwardContext())
        opt.step()
        bal.step()
        assert [metrics[f"weight/{t}"].item() for t in TASKS] == pytest.approx(ref_weights[step].tolist(), rel=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------- the contract


def test_state_dict_round_trip_continues_identically():
    saved, _ = assert_resume_continues(
        lambda model: RandomLossWeighting(list(TASKS), seed=5),
        range(3),
        range(3, 6),
        remake=lambda model: RandomLossWeighting(list(TASKS), seed=99),
    )  # the seed comes from the state
    assert {"weighting.weights", "weighting.rng._extra_state"} <= set(saved)


def test_a_skipped_step_keeps_the_weights_for_its_retry():
    model, bal = pair_model(), RandomLossWeighting(list(TASKS), seed=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = bal.weighting.weights.clone()
    out, losses = pair_losses(model, 0)
    first = bal.backward(losses, out.shared, scaler)
    model.heads["a"].bias.grad.fill_(float("inf"))  # the scaler skips this step
    scaler.step(opt)
    scaler.update()
    bal.step()
    assert torch.equal(bal.weighting.weights, before)
    opt.zero_grad()
    out, losses = pair_losses(model, 0)
    retry = bal.backward(losses, out.shared, scaler)
    scaler.step(opt)
    scaler.update()
    bal.step()
    assert all(torch.equal(first[k], retry[k]) for k in first)
    assert not torch.equal(bal.weighting.weights, before)


def test_per_task_mode_and_accumulation_use_one_draw_per_step():
    joint_model, joint = pair_model(), RandomLossWeighting(list(TASKS), seed=4)
    model, bal = pair_model(), RandomLossWeighting(list(TASKS), seed=4)
    for step in range(3):
        joint_model.zero_grad()
        model.zero_grad()
        out, losses = pair_losses(joint_model, step)
        expected = joint.backward(losses, out.shared)
        metrics: dict[str, torch.Tensor] = {}
        ctx = BackwardContext(factor=0.5, accumulation_steps=2)
        for _ in range(2):  # two micro-batches, each task on its own
            for task in ("b", "a"):
                out, losses = pair_losses(model, step)
                metrics |= bal.backward_task(task, losses[task], out.shared, ctx)
        bal.step()
        for key in expected:
            assert torch.equal(metrics[key], expected[key]), key
        for g, ref in zip((p.grad for p in model.parameters()), (p.grad for p in joint_model.parameters())):
            torch.testing.assert_close(g, ref)


def test_metrics_and_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    metrics = metrics_without_host_sync(RandomLossWeighting(list(TASKS)), monkeypatch)
    assert set(metrics) == {f"weight/{t}" for t in TASKS}


def DDP_BALANCER(names: list[str], model: MultiTaskModel):  # noqa: N802 (read by the spawned workers)
    return RandomLossWeighting(names, seed=3)


DDP_STEPS = 3


@pytest.mark.slow  # two spawned processes: about 25 s on 2 shared cores
def test_ddp_ranks_hold_the_state_of_one_process_on_the_whole_batch(tmp_path: Path):
    assert_ddp_is_one_process_on_the_whole_batch(tmp_path, DDP_BALANCER, DDP_STEPS)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seed": 1.5}, "seed: must be an integer, got 1.5"),
        ({"distribution": "cauchy"}, "distribution: 'cauchy' is not one of normal, uniform, dirichlet, bernoulli"),
    ],
)
def test_bad_options_name_their_argument(options, message):
    with pytest.raises(ValueError) as info:
        RandomLossWeighting(list(TASKS), **options)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("generator", ["_extra_state", "rng._extra_state"])
def test_a_checkpoint_of_an_older_layout_is_refused_in_one_line(generator):
    """The state at the balancer's root: the weights and the generator as its own state, or in its own module."""
    state = RandomLossWeighting(list(TASKS), seed=5).state_dict()
    older = {"weights": state["weighting.weights"], generator: state["weighting.rng._extra_state"]}
    with pytest.raises(
        ContractError, match=r"the checkpoint keeps .* layout this version does not read.*new run"
    ) as err:
        RandomLossWeighting(list(TASKS), seed=5).load_state_dict(older)
    assert "\n" not in str(err.value)
