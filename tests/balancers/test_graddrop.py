"""GradDrop: the mask by hand, against LibMTL 1.1.5 (rep_grad=True) with the sign draws seeded alike."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from mtl_bench.balancers import BackwardContext, GradDrop
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_same_parameters,
    batch,
    libmtl_weighting,
    make_model,
    no_host_sync,
    task_losses,
    train_libmtl,
    train_ours,
)


def build(model, tasks=TASKS3, **options) -> GradDrop:
    return GradDrop(list(tasks), list(model.trunk.parameters()), **options)


def test_mask_by_hand():
    """Two tasks on a 1×2 representation z = (1, 1): gradients (1, 2) and (−3, 2). Feature 2 is pure
    (P = 1): both kept. Feature 1 has P = ½(1 + (1−3)/4) = 0.25: the positive sign survives iff U < 0.25."""
    z = torch.ones(1, 2, requires_grad=True)
    losses = {"a": z @ torch.tensor([1.0, 2.0]), "b": z @ torch.tensor([-3.0, 2.0])}
    bal = GradDrop(["a", "b"], seed=0)
    draw = torch.rand(2, generator=torch.Generator().manual_seed(0))
    metrics = bal.backward({k: v.sum() for k, v in losses.items()}, z)
    expected_first = 1.0 if draw[0] < 0.25 else -3.0
    torch.testing.assert_close(z.grad, torch.tensor([[expected_first, 4.0]]))
    assert metrics["graddrop/kept/a"].item() == (1.0 if draw[0] < 0.25 else 0.5)


def test_matches_libmtl_seeded_alike():
    ours, reference = make_model(), make_model()
    train_ours(ours, build(ours, seed=5, leak=0.2), 5)
    torch.manual_seed(5)  # LibMTL draws U with torch.rand_like: the same numbers as our generator
    train_libmtl(reference, libmtl_weighting("GradDrop", reference, TASKS3, rep_grad=True), 5, leak=0.2)
    assert_same_parameters(ours, reference)


def test_scaler_state_and_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    plain, scaled = make_model(), make_model()
    x, y = batch()
    out, losses = task_losses(plain, x, y)
    build(plain, seed=1).backward(losses, out.shared)
    bal = build(scaled, seed=1)
    saved = copy.deepcopy(bal.state_dict())
    out, losses = task_losses(scaled, x, y)
    with no_host_sync(monkeypatch):
        bal.backward(losses, out.shared, BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=16.0)))
        bal.step()
    for p, q in zip(plain.parameters(), scaled.parameters()):
        torch.testing.assert_close(q.grad / 16, p.grad, rtol=1e-5, atol=1e-7)
    resumed = build(make_model(), seed=2)
    resumed.load_state_dict(saved)
    assert torch.equal(
        resumed.aggregator.rng.generator.get_state(), build(make_model(), seed=1).aggregator.rng.generator.get_state()
    )


def test_bad_options_fail_clearly():
    model = make_model()
    assert "grad_source" not in inspect.signature(GradDrop).parameters  # shared_rep only: no option for it
    with pytest.raises(TypeError, match="grad_source"):
        build(model, grad_source="shared_params")
    with pytest.raises(ValueError, match="^leak"):
        build(model, leak=2.0)
    x, y = batch()
    out, losses = task_losses(model, x, y)
    with pytest.raises(RuntimeError, match="per-task mode"):
        build(model).backward_task("a", losses["a"], out.shared)
