"""RescaledNormBalancer: the EnCodec balancer's maths on tiny cases, its seed's own test, and the defects we fix."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtl_bench.balancers import BackwardContext, RescaledNormBalancer, rescaled_norm
from mtl_bench.models.base import MultiTaskModel
from tests.helpers.balancer_kit import no_host_sync

A = torch.tensor([[3.0, 4.0], [0.0, 1.0]])  # per-item norms 5, 1 (mean 3); global norm √26
B = torch.tensor([[0.0, 2.0], [0.0, 0.0]])  # per-item norms 2, 0 (mean 1); global norm 2


def rescaled(weights, **options):
    """A RescaledNormBalancer over the tasks of `weights`."""
    return RescaledNormBalancer(list(weights), weights=weights, **options)


def linear_losses(shared: torch.Tensor, ca: torch.Tensor = A, cb: torch.Tensor = B) -> dict[str, torch.Tensor]:
    """L = Σ c ∘ shared, so ∂L/∂shared = c exactly."""
    return {"a": (ca * shared).sum(), "b": (cb * shared).sum()}


def make_model(seed: int = 0) -> MultiTaskModel:
    torch.manual_seed(seed)
    trunk = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh())
    return MultiTaskModel(trunk, {"a": nn.Linear(4, 1), "b": nn.Linear(4, 2)}, last_shared_layer=trunk[2])


def batch(seed: int = 1, n: int = 5) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, {"a": torch.randn(n, 1, generator=g), "b": 10 * torch.randn(n, 2, generator=g)}


def model_losses(model: MultiTaskModel, x: torch.Tensor, y: dict[str, torch.Tensor]):
    out = model(x)
    return out, {k: F.mse_loss(out.preds[k], y[k]) for k in ("a", "b")}


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_seed_test_verbatim():
    """The seed's `test()` (seeds/000, EnCodec's balancer) word for word, its Balancer being ours: the constructor
    form `Balancer(weights={...}, rescale_grads=...)` and `balancer.backward(losses, x)`."""
    Balancer = RescaledNormBalancer

    from torch.nn import functional as F

    x = torch.zeros(1, requires_grad=True)
    one = torch.ones_like(x)
    loss_1 = F.l1_loss(x, one)
    loss_2 = 100 * F.l1_loss(x, -one)
    losses = {"1": loss_1, "2": loss_2}
    balancer = Balancer(weights={"1": 1, "2": 1}, rescale_grads=False)
    balancer.backward(losses, x)
    assert torch.allclose(x.grad, torch.tensor(99.0)), x.grad
    loss_1 = F.l1_loss(x, one)
    loss_2 = 100 * F.l1_loss(x, -one)
    losses = {"1": loss_1, "2": loss_2}
    x.grad = None
    balancer = Balancer(weights={"1": 1, "2": 1}, rescale_grads=True)
    balancer.backward({"1": loss_1, "2": loss_2}, x)
    assert torch.allclose(x.grad, torch.tensor(0.0)), x.grad


def test_seed_docs_positional_form():
    """The seed's docstring: `weights = {'loss_a': 1, 'loss_b': 4}; balancer = Balancer(weights, ...)`."""
    x = torch.zeros(2, 1, requires_grad=True)
    weights = {"loss_a": 1, "loss_b": 4}
    balancer = RescaledNormBalancer(weights, rescale_grads=False, monitor=False)
    losses = {"loss_a": (3 * x).sum(), "loss_b": (5 * x).sum()}
    balancer.backward(losses, x)
    assert torch.equal(x.grad, torch.full((2, 1), 1 * 3 + 4 * 5.0))


def test_seed_upstream_test_through_public_api():
    x = torch.zeros(1, requires_grad=True)
    one = torch.ones_like(x)
    losses = {"1": F.l1_loss(x, one), "2": 100 * F.l1_loss(x, -one)}
    rescaled({"1": 1, "2": 1}, rescale_grads=False).backward(losses, x)
    assert torch.allclose(x.grad, torch.tensor(99.0)), x.grad
    x.grad = None
    losses = {"1": F.l1_loss(x, one), "2": 100 * F.l1_loss(x, -one)}
    rescaled({"1": 1, "2": 1}, rescale_grads=True).backward(losses, x)
    assert torch.allclose(x.grad, torch.tensor(0.0)), x.grad


@pytest.mark.parametrize("per_batch_item, na, nb", [(True, 3.0, 1.0), (False, 26**0.5, 2.0)])
def test_scales_follow_the_formula(per_batch_item: bool, na: float, nb: float):
    shared = torch.zeros(2, 2, requires_grad=True)
    bal = rescaled({"a": 1.0, "b": 3.0}, total_norm=2.0, per_batch_item=per_batch_item, monitor=True)
    metrics = bal.backward(linear_losses(shared), shared)
    scale_a, scale_b = 0.25 * 2.0 / na, 0.75 * 2.0 / nb  # (w_k/Σw)·total_norm/(ε + avg_k), avg = n at step 1
    assert metrics["weight/a"].item() == pytest.approx(scale_a)
    assert metrics["weight/b"].item() == pytest.approx(scale_b)
    assert metrics["grad_norm/a"].item() == pytest.approx(na)
    assert metrics["ratio/a"].item() == pytest.approx(na / (na + nb))
    torch.testing.assert_close(shared.grad, scale_a * A + scale_b * B)
    assert all(v.dim() == 0 for v in metrics.values())


@pytest.mark.parametrize("decay, expected_avg_a", [(0.5, (0.5 * 3 + 6) / 1.5), (1.0, 4.5)])
def test_ema_is_bias_corrected(decay: float, expected_avg_a: float):
    bal = rescaled({"a": 1.0, "b": 3.0}, total_norm=2.0, ema_decay=decay, monitor=True)
    for ca in (A, 2 * A):  # norms of task a: 3 then 6; task b: 1 and 1
        shared = torch.zeros(2, 2, requires_grad=True)
        metrics = bal.backward(linear_losses(shared, ca), shared)
    assert metrics["weight/a"].item() == pytest.approx(0.25 * 2.0 / expected_avg_a)
    assert metrics["ratio/a"].item() == pytest.approx(expected_avg_a / (expected_avg_a + 1.0))
    assert (bal.ema_sum / bal.ema_count)[0].item() == pytest.approx(expected_avg_a)


def test_one_dim_output_is_a_batch_of_scalars():
    shared = torch.zeros(3, requires_grad=True)
    losses = {"a": (torch.tensor([3.0, -4.0, 0.0]) * shared).sum(), "b": (torch.tensor([1.0, 1.0, 1.0]) * shared).sum()}
    metrics = rescaled({"a": 1.0, "b": 1.0}).backward(losses, shared)
    assert metrics["grad_norm/a"].item() == pytest.approx(7 / 3)  # mean of |3|, |-4|, |0|, not the global 5
    assert metrics["grad_norm/b"].item() == pytest.approx(1.0)


def test_heads_receive_their_own_scales():
    model = make_model()
    x, y = batch()
    out, losses = model_losses(model, x, y)
    metrics = rescaled({"a": 1.0, "b": 1.0}).backward(losses, out.shared)
    got = grads(model)
    scales = {k: metrics[f"weight/{k}"] for k in ("a", "b")}
    assert scales["a"].item() != pytest.approx(scales["b"].item())
    model.zero_grad()
    out, losses = model_losses(model, x, y)
    (scales["a"] * losses["a"] + scales["b"] * losses["b"]).backward()
    for g, ref in zip(got, grads(model)):
        torch.testing.assert_close(g, ref)
    assert model.heads["a"].weight.grad.abs().sum() > 0


def test_plain_weighted_sum_computes_no_per_loss_gradient(monkeypatch: pytest.MonkeyPatch):
    calls = []
    real = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: calls.append(1) or real(*a, **k))
    shared = torch.zeros(2, 2, requires_grad=True)
    metrics = rescaled({"a": 2.0, "b": 0.5}, rescale_grads=False, monitor=False).backward(linear_losses(shared), shared)
    assert calls == []
    torch.testing.assert_close(shared.grad, 2.0 * A + 0.5 * B)
    assert sorted(metrics) == ["weight/a", "weight/b"] and metrics["weight/a"].item() == 2.0


def test_bad_keys_and_options_are_rejected():
    bal = rescaled({"a": 1.0, "b": 1.0})
    shared = torch.zeros(2, 2, requires_grad=True)
    for losses in ({"a": shared.sum()}, {"a": shared.sum(), "b": shared.sum(), "c": shared.sum()}, {}):
        with pytest.raises(KeyError, match="do not match"):
            bal.backward(losses, shared)
    with pytest.raises(ValueError, match="weights.b: must be"):
        rescaled({"a": 1.0, "b": -1.0})
    with pytest.raises(ValueError, match="sum to 0"):
        rescaled({"a": 0.0})
    with pytest.raises(ValueError, match="ema_decay"):
        rescaled({"a": 1.0}, ema_decay=0.0)
    with pytest.raises(ValueError, match="at least one task"):
        rescaled({})


def train(model: MultiTaskModel, bal: RescaledNormBalancer, steps: range, scaler=None) -> dict[str, torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics: dict[str, torch.Tensor] = {}
    for step in steps:
        x, y = batch(seed=step)
        opt.zero_grad()
        out, losses = model_losses(model, x, y)
        metrics = bal.backward(losses, out.shared, scaler)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        metrics |= bal.step()
    return metrics


def test_state_dict_round_trip_continues_identically():
    model, bal = make_model(), rescaled({"a": 1.0, "b": 2.0}, ema_decay=0.9)
    train(model, bal, range(2))
    saved_model, saved_bal = copy.deepcopy(model.state_dict()), copy.deepcopy(bal.state_dict())
    assert {"ema_sum", "ema_count", "weights"} <= set(saved_bal)
    straight = train(model, bal, range(2, 4))

    resumed_model, resumed = make_model(seed=5), rescaled({"a": 1.0, "b": 2.0}, ema_decay=0.9)
    resumed_model.load_state_dict(saved_model)
    resumed.load_state_dict(saved_bal)
    again = train(resumed_model, resumed, range(2, 4))
    assert again.keys() == straight.keys()
    for key in straight:
        assert torch.equal(again[key], straight[key]), key
    assert torch.equal(resumed.ema_sum, bal.ema_sum)


def test_grad_scaler_norms_are_unscaled_and_skipped_steps_change_nothing():
    reference = train(make_model(), rescaled({"a": 1.0, "b": 2.0}), range(3))
    model, bal = make_model(), rescaled({"a": 1.0, "b": 2.0})
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    scaled = train(model, bal, range(3), scaler)
    for key in reference:
        torch.testing.assert_close(scaled[key], reference[key], rtol=1e-5, atol=0)

    before = {k: v.clone() for k, v in bal.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch(seed=9)
    out, losses = model_losses(model, x, y)
    bal.backward(losses, out.shared, scaler)
    assert all(torch.equal(v, before[k]) for k, v in bal.state_dict().items())  # staged, not committed
    model.heads["a"].bias.grad.fill_(float("inf"))  # the scaler will skip this step
    scaler.step(opt)
    scaler.update()
    bal.step()
    assert all(torch.equal(v, before[k]) for k, v in bal.state_dict().items())

    out, losses = model_losses(model, x, y)
    bal.backward(losses, out.shared, scaler)
    with pytest.raises(RuntimeError, match="still pending"):  # the loop forgot balancer.step()
        bal.backward(losses, out.shared, scaler)


def test_fp16_autocast_with_scaler_matches_fp32():
    reference = train(make_model(), rescaled({"a": 1.0, "b": 2.0}), range(1))
    model, bal = make_model(), rescaled({"a": 1.0, "b": 2.0})
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)  # no fp16 overflow at this scale
    x, y = batch(seed=0)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
        losses = {k: F.mse_loss(out.preds[k].float(), y[k]) for k in ("a", "b")}
    assert out.shared.dtype == torch.float16
    metrics = bal.backward(losses, out.shared, scaler)
    for key in reference:
        torch.testing.assert_close(metrics[key], reference[key], rtol=2e-2, atol=0)


def test_with_a_context_updates_wait_for_step_and_a_skip_drops_them():
    bal = rescaled({"a": 1.0, "b": 1.0})
    for skipped, changed in ((True, False), (torch.tensor(True), False), (torch.tensor(False), True), (None, True)):
        before = bal.ema_sum.clone()
        shared = torch.zeros(2, 2, requires_grad=True)
        bal.backward(linear_losses(shared), shared, BackwardContext())
        assert torch.equal(bal.ema_sum, before)
        bal.step(skipped)
        assert (not torch.equal(bal.ema_sum, before)) == changed, skipped


def test_non_finite_norms_never_enter_the_state():
    bal = rescaled({"a": 1.0, "b": 1.0})
    shared = torch.zeros(2, 2, requires_grad=True)
    bal.backward(linear_losses(shared, A * float("nan")), shared)
    assert torch.equal(bal.ema_count, torch.zeros(2))


def test_per_task_mode_gives_the_joint_gradients_and_state():
    x, y = batch()
    joint_model, joint = make_model(), rescaled({"a": 1.0, "b": 3.0}, monitor=True)
    out, losses = model_losses(joint_model, x, y)
    expected = joint.backward(losses, out.shared)

    model, bal = make_model(), rescaled({"a": 1.0, "b": 3.0}, monitor=True)
    metrics: dict[str, torch.Tensor] = {}
    for task in ("b", "a"):  # separate forwards, one task each, gradients accumulate
        out, losses = model_losses(model, x, y)
        metrics |= bal.backward_task(task, losses[task], out.shared)
    assert torch.equal(bal.ema_count, torch.zeros(2))  # nothing committed before step()
    metrics |= bal.step()
    assert metrics.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(metrics[key], expected[key])
    for g, ref in zip(grads(model), grads(joint_model)):
        torch.testing.assert_close(g, ref)
    torch.testing.assert_close(bal.ema_sum, joint.ema_sum)

    out, losses = model_losses(model, x, y)
    bal.backward_task("a", losses["a"], out.shared)
    with pytest.raises(RuntimeError, match="already had its backward"):
        bal.backward_task("a", losses["a"], out.shared)
    with pytest.raises(RuntimeError, match=r"\['b'\]"):
        bal.step()


def test_hot_path_has_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    model, bal = make_model(), rescaled({"a": 1.0, "b": 2.0}, monitor=True)
    scaler = torch.amp.GradScaler("cpu")
    x, y = batch()
    out, losses = model_losses(model, x, y)
    with no_host_sync(monkeypatch):
        bal.backward(losses, out.shared, scaler)
        bal.step()  # the skip check stays on the device
        for task in ("a", "b"):
            out, losses = model_losses(model, x, y)
            bal.backward_task(task, losses[task], out.shared, scaler)
        bal.step()


def test_trunk_gradients_match_encodecs_balancer():
    """Ours against EnCodec's Balancer (benchmarks.encodec_balancer, its public code step for step) on the
    same model and batches over three steps of the EMA: the trunk's gradients agree; EnCodec's heads get none."""
    from benchmarks.encodec_balancer import EncodecBalancer

    model = make_model()
    ours = rescaled({"a": 1.0, "b": 3.0}, ema_decay=0.5)
    theirs = EncodecBalancer({"a": 1.0, "b": 3.0}, ema_decay=0.5)
    for seed in (1, 2, 3):
        x, y = batch(seed)
        model.zero_grad(set_to_none=True)
        out, losses = model_losses(model, x, y)
        ours.backward(losses, out.shared)
        got = [p.grad.clone() for p in model.trunk.parameters()]
        assert all(p.grad is not None for p in model.heads.parameters())
        model.zero_grad(set_to_none=True)
        out, losses = model_losses(model, x, y)
        theirs.backward(losses, out.shared)
        for g, ref in zip(got, (p.grad for p in model.trunk.parameters())):
            torch.testing.assert_close(g, ref)
        assert all(p.grad is None for p in model.heads.parameters())


def test_a_head_reading_the_trunk_directly_gets_the_full_backward():
    """When a loss reads a trunk parameter other than through `shared`, the head-only shortcut would miss that
    path: the balancer runs the full backward of Σ scale_k L_k, whose gradients it must equal."""
    model = make_model()
    x, y = batch()
    bal = rescaled({"a": 1.0, "b": 1.0})

    def losses_with_skip():
        out, losses = model_losses(model, x, y)
        losses["a"] = losses["a"] + model.trunk[0].weight.square().sum()  # reads the trunk's first layer directly
        return out, losses

    out, losses = losses_with_skip()
    metrics = bal.backward(losses, out.shared)
    got = grads(model)
    model.zero_grad()
    out, losses = losses_with_skip()
    (metrics["weight/a"] * losses["a"] + metrics["weight/b"] * losses["b"]).backward()
    for g, ref in zip(got, grads(model)):
        torch.testing.assert_close(g, ref)


def test_a_head_two_losses_read_gets_both_scaled_gradients(monkeypatch):
    """Each head's gradient from its per-task backward (factor 0), where loss b also reads head a: head a gets
    scale_a ∇_a L_a + scale_b ∇_a L_b, as in the full backward of Σ scale_k L_k."""
    monkeypatch.setattr(rescaled_norm, "SMALL_HEAD_FACTOR", 0)
    model, (x, y) = make_model(), batch()
    bal = rescaled({"a": 1.0, "b": 1.0})

    def losses_sharing_head_a():
        out, losses = model_losses(model, x, y)
        losses["b"] = losses["b"] + model.heads["a"](out.shared).square().mean()
        return out, losses

    out, losses = losses_sharing_head_a()
    metrics = bal.backward(losses, out.shared)
    assert bal._small_heads is False
    got = grads(model)
    model.zero_grad()
    _, losses = losses_sharing_head_a()
    (metrics["weight/a"] * losses["a"] + metrics["weight/b"] * losses["b"]).backward()
    for g, ref in zip(got, grads(model)):
        torch.testing.assert_close(g, ref)


def test_head_gradients_kept_or_a_second_head_backward_train_alike(monkeypatch):
    # heads of 5 and 10 parameters beside 4 shared features: small under the default factor (the full backward of
    # Σ scale_k L_k); with factor 0 each head's gradient comes from its per-task backward, then one write
    small_model, small = make_model(), rescaled({"a": 1.0, "b": 2.0})
    small_metrics = train(small_model, small, range(3))
    monkeypatch.setattr(rescaled_norm, "SMALL_HEAD_FACTOR", 0)
    kept_model, kept = make_model(), rescaled({"a": 1.0, "b": 2.0})
    kept_metrics = train(kept_model, kept, range(3))
    assert small._small_heads is True and kept._small_heads is False
    torch.testing.assert_close(kept_metrics, small_metrics)
    torch.testing.assert_close(dict(kept_model.named_parameters()), dict(small_model.named_parameters()))
