"""PCGrad: the projections by hand, against LibMTL 1.1.5 and torchjd 0.18, scaler, per-task mode, state."""

from __future__ import annotations

import copy
import inspect

import numpy as np
import pytest
import torch

from mtl_bench.balancers import BackwardContext, GramianBalancer, PCGrad
from mtl_bench.balancers.pcgrad import pcgrad_weights
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


def build(model, tasks=TASKS3, **options) -> PCGrad:
    return PCGrad(list(tasks), list(model.trunk.parameters()), **options)


def test_two_conflicting_gradients_by_hand():
    # g1 = (1, 0), g2 = (−1, 1): g1·g2 = −1. g1^PC = g1 − (−1/2) g2 = (0.5, 0.5); g2^PC = g2 − (−1/1) g1 = (0, 1).
    # Sum = (0.5, 1.5) = 0.5·g1... in weights: w1 = 1 + 1 = 2, w2 = 1 + 0.5 = 1.5: 2·(1,0) + 1.5·(−1,1) = (0.5, 1.5).
    gram = np.array([[1.0, -1.0], [-1.0, 2.0]])
    weights, projections = pcgrad_weights(gram, [[1], [0]])
    assert weights.tolist() == pytest.approx([2.0, 1.5]) and projections == 2
    weights, projections = pcgrad_weights(np.array([[1.0, 0.5], [0.5, 2.0]]), [[1], [0]])
    assert weights.tolist() == [1.0, 1.0] and projections == 0


def test_direction_on_a_linear_model():
    """Shared parameter θ ∈ R²; L_a = g_a·θ, L_b = g_b·θ: the shared gradient is the PCGrad sum."""
    theta = torch.nn.Parameter(torch.zeros(2))
    bal = PCGrad(["a", "b"], [theta], seed=0)
    shared = theta * 1.0
    losses = {"a": shared @ torch.tensor([1.0, 0.0]), "b": shared @ torch.tensor([-1.0, 1.0])}
    metrics = bal.backward(losses, shared)
    torch.testing.assert_close(theta.grad, torch.tensor([0.5, 1.5]))
    assert metrics["pcgrad/projections"].item() == 2
    assert metrics["weight/a"].item() == pytest.approx(2.0) and metrics["weight/b"].item() == pytest.approx(1.5)
    assert metrics["grad_cos/a/b"].item() == pytest.approx(-1 / 2**0.5)


def test_matches_libmtl_with_two_tasks():
    """T = 2 leaves no order to draw: LibMTL's shuffle and ours cannot differ."""
    tasks = ("a", "b")
    ours, reference = make_model(tasks), make_model(tasks)
    train_ours(ours, build(ours, tasks, seed=0), 5, tasks)
    train_libmtl(reference, libmtl_weighting("PCGrad", reference, tasks), 5, tasks)
    assert_same_parameters(ours, reference)


def test_matches_torchjd_with_three_tasks_seeded_alike():
    aggregation = pytest.importorskip("torchjd.aggregation")
    ours, reference = make_model(), make_model()
    history = train_ours(ours, build(ours, seed=1234), 6)
    torch.manual_seed(1234)  # torchjd draws its orders from the global RNG, the same calls as our generator
    train_torchjd(reference, aggregation.PCGrad(), 6)
    assert_same_parameters(ours, reference)
    assert sum(m["pcgrad/projections"].item() for m in history) > 0  # the case exercises projections


def test_grad_scaler_and_accumulation_give_the_same_step():
    plain, scaled = make_model(), make_model()
    train_ours(plain, build(plain, seed=3), 3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    opt = torch.optim.SGD(scaled.parameters(), lr=0.1)
    bal = build(scaled, seed=3)
    for step in range(3):
        x, y = batch(seed=step)
        opt.zero_grad()
        out, losses = task_losses(scaled, x, y)
        bal.backward(losses, out.shared, BackwardContext(scaler=scaler))
        scaler.step(opt)
        scaler.update()
        bal.step()
    assert_same_parameters(scaled, plain)


def test_accumulation_solves_on_the_summed_jacobian():
    """Two micro-batches of 3 with factor 1/2 give the step of one batch of 6 (MSE means)."""
    whole, split = make_model(), make_model()
    x, y = batch(n=6)
    bal = build(whole, seed=5)
    out, losses = task_losses(whole, x, y)
    expected = bal.backward(losses, out.shared)
    bal = build(split, seed=5)
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    for half in (slice(0, 3), slice(3, 6)):
        out, losses = task_losses(split, x[half], {t: v[half] for t, v in y.items()})
        metrics = bal.backward(losses, out.shared, ctx)
    bal.step()
    for p, q in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(metrics["weight/a"], expected["weight/a"])


def test_per_task_mode_gives_the_joint_step():
    joint, per_task = make_model(), make_model()
    x, y = batch()
    out, losses = task_losses(joint, x, y)
    expected = build(joint, seed=9).backward(losses, out.shared)
    bal = build(per_task, seed=9)
    metrics = {}
    for task in ("c", "a", "b"):
        out, losses = task_losses(per_task, x, y)
        metrics |= bal.backward_task(task, losses[task], out.shared)
    metrics |= bal.step()
    assert metrics.keys() == expected.keys()
    for p, q in zip(joint.parameters(), per_task.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7)


def test_generator_state_round_trip_continues_identically():
    model = make_model()
    bal = build(model)
    train_ours(model, bal, 2)
    saved_model, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(bal.state_dict())
    straight = train_ours(model, bal, 3)
    resumed_model = make_model(seed=5)
    resumed_model.load_state_dict(saved_model)
    resumed = build(resumed_model, seed=77)
    resumed.load_state_dict(saved)
    again = train_ours(resumed_model, resumed, 3)
    assert_same_parameters(resumed_model, model, rtol=0, atol=0)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(again, straight) for k in a)


def test_bad_options_fail_clearly():
    model = make_model()
    assert "grad_source" not in inspect.signature(PCGrad).parameters  # shared_params only: no option for it
    with pytest.raises(TypeError, match="grad_source"):
        build(model, grad_source="shared_rep")
    with pytest.raises(ValueError, match="^grad_source: 'trunk' is not one of shared_params, shared_rep$"):
        GramianBalancer(list(TASKS3), list(model.trunk.parameters()), grad_source="trunk")
    with pytest.raises(ValueError, match="^shared_params"):
        PCGrad(list(TASKS3), [])
    with pytest.raises(ValueError, match="^seed"):
        build(model, seed=1.5)
