"""GradNorm: the paper's update by hand and against autograd, the fast Linear norms, resume, AMP, per-task mode."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtl_bench.balancers import GradNorm
from mtl_bench.balancers.gradnorm import linear_weight_grad_norms
from mtl_bench.models.base import MultiTaskModel
from tests.helpers.balancer_kit import no_host_sync

TASKS = ("a", "b", "c")


def make_model(seed: int = 0) -> MultiTaskModel:
    torch.manual_seed(seed)
    trunk = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 5), nn.Tanh())
    heads = {"a": nn.Linear(5, 1), "b": nn.Linear(5, 2), "c": nn.Linear(5, 1)}
    return MultiTaskModel(trunk, heads, last_shared_layer=trunk[2])


def batch(seed: int = 1, n: int = 6) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    scales = {"a": 1.0, "b": 5.0, "c": 0.3}
    return torch.randn(n, 3, generator=g), {
        k: s * torch.randn(n, 2 if k == "b" else 1, generator=g) for k, s in scales.items()
    }


def model_losses(model: MultiTaskModel, x: torch.Tensor, y: dict[str, torch.Tensor]):
    out = model(x)
    return out, {k: F.mse_loss(out.preds[k], y[k]) for k in TASKS}


def train(model: MultiTaskModel, bal: GradNorm, steps: range, scaler=None) -> dict[str, torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
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


def scalar_case(w_layer: nn.Linear, ka: float, kb: float) -> dict[str, torch.Tensor]:
    """z = W·1 with W = 1: L_a = z + ka (n_a = 1, L_a = 1 + ka), L_b = 3z + kb (n_b = 3, L_b = 3 + kb)."""
    z = w_layer(torch.ones(1, 1))
    return {"a": (z + ka).sum(), "b": (3 * z + kb).sum()}


def test_one_update_by_hand():
    layer = nn.Linear(1, 1, bias=False)
    nn.init.ones_(layer.weight)
    bal = GradNorm(["a", "b"], shared_layer=layer, alpha=1.5, lr=0.1, optimizer="sgd")
    # Step 1: L = (2, 1) = L(0), so r = (1, 1); G = w·n = (1, 3), Ḡ = 2, target = (2, 2), L_grad = 1 + 1.
    # ∂L_grad/∂w = sign(G − target)·n = (−1, 3); w − 0.1·grad = (1.1, 0.7), renormalised to Σw = 2.
    m = bal.backward(scalar_case(layer, 1.0, -2.0), torch.ones(1))
    assert [m[f"gradnorm/target/{t}"].item() for t in "ab"] == pytest.approx([2.0, 2.0])
    assert [m[f"gradnorm/loss_ratio/{t}"].item() for t in "ab"] == pytest.approx([1.0, 1.0])
    assert [m[f"gradnorm/norm_share/{t}"].item() for t in "ab"] == pytest.approx([0.25, 0.75])
    assert not any(k.startswith("ratio/") for k in m)  # rescaled_norm's tag, a share of raw norms
    assert m["gradnorm/L_grad"].item() == pytest.approx(2.0)
    assert bal.weights.tolist() == pytest.approx([1.1 * 2 / 1.8, 0.7 * 2 / 1.8])
    # Step 2: L = (1, 1.5), L̃ = (0.5, 1.5) = r; w = (11/9, 7/9); G = (11/9, 21/9), Ḡ = 16/9;
    # target = Ḡ·r^1.5 = (0.628539, 3.265986); signs (+, −) so grad = (1, −3);
    # w = (11/9 − 0.1, 7/9 + 0.3), Σ = 2.2, renormalised to Σ = 2.
    m = bal.backward(scalar_case(layer, 0.0, -1.5), torch.ones(1))
    assert [m[f"gradnorm/target/{t}"].item() for t in "ab"] == pytest.approx([0.628539, 3.265986], rel=1e-5)
    assert m["gradnorm/L_grad"].item() == pytest.approx(1.526336, rel=1e-5)
    assert bal.weights.tolist() == pytest.approx([1.020202, 0.979798], rel=1e-5)


def test_first_adam_step_moves_each_weight_by_lr():
    layer = nn.Linear(1, 1, bias=False)
    nn.init.ones_(layer.weight)
    bal = GradNorm(["a", "b"], shared_layer=layer, lr=0.025)  # Adam's first step is lr·sign(grad)
    bal.backward(scalar_case(layer, 1.0, -2.0), torch.ones(1))
    assert bal.weights.tolist() == pytest.approx([1.025, 0.975], abs=1e-6)


# 130 and 200 rows: the Gram path in 4 row blocks (130 = 32 + 33 + 32 + 33), only those on and above the diagonal
@pytest.mark.parametrize(
    "rows, width_in, bias",
    [(4, 6, True), (4, 6, False), (9, 3, True), (9, 3, False), (130, 150, False), (200, 300, True)],
)
def test_linear_norms_equal_the_weight_gradient_norm(rows: int, width_in: int, bias: bool):
    g = torch.Generator().manual_seed(rows)
    layer = nn.Linear(width_in, 5, bias=bias)
    a = torch.randn(rows, width_in, generator=g)
    deltas = [torch.randn(rows, 5, generator=g) for _ in range(3)]
    z = layer(a)
    expected = []
    for d in deltas:
        grads = torch.autograd.grad(z, list(layer.parameters()), d, retain_graph=True)
        expected.append(torch.sqrt(sum((gr**2).sum() for gr in grads)))
    torch.testing.assert_close(linear_weight_grad_norms(a, deltas, bias), torch.stack(expected), rtol=1e-5, atol=1e-6)
    # A Linear over a sequence: the leading dimensions are rows too.
    seq = linear_weight_grad_norms(a.reshape(1, rows, width_in), [d.reshape(1, rows, 5) for d in deltas], bias)
    torch.testing.assert_close(seq, torch.stack(expected), rtol=1e-5, atol=1e-6)


def test_update_equals_autograd_create_graph_gradient():
    """The closed-form ∂L_grad/∂w against the double backward most implementations use."""
    model, (x, y) = make_model(), batch()
    w0, initial, alpha, lr = torch.tensor([0.5, 1.5, 1.0]), {"a": 2.0, "b": 30.0, "c": 1.0}, 1.5, 1e-2
    layer = model.last_shared_layer

    w = w0.clone().requires_grad_(True)
    _, losses = model_losses(model, x, y)
    norms = []
    for i, t in enumerate(TASKS):
        grads = torch.autograd.grad(w[i] * losses[t], list(layer.parameters()), create_graph=True)
        norms.append(torch.sqrt(sum((g**2).sum() for g in grads)))
    G = torch.stack(norms)
    L = torch.stack([losses[t] for t in TASKS]).detach()
    ratio = L / torch.tensor([initial[t] for t in TASKS])
    target = (G.mean() * (ratio / ratio.mean()) ** alpha).detach()
    l_grad = (G - target).abs().sum()
    (grad,) = torch.autograd.grad(l_grad, w)
    stepped = w0 - lr * grad
    expected = stepped * 3 / stepped.sum()

    bal = GradNorm(list(TASKS), shared_layer=layer, alpha=alpha, lr=lr, optimizer="sgd", initial_losses=initial)
    bal.weights.copy_(w0)
    out, losses = model_losses(model, x, y)
    metrics = bal.backward(losses, out.shared)
    assert metrics["gradnorm/L_grad"].item() == pytest.approx(l_grad.item(), rel=1e-5)
    torch.testing.assert_close(bal.weights, expected, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(bal.weights, w0 * 3 / w0.sum())  # the step did something


# "skip": task a's loss also reads the trunk's first layer directly, so the gradient at the measured tensor
# misses a path and the balancer must run the full backward of Σ w_i L_i. "shared_head": task c's loss also reads
# task a's head, whose parameters then get the sum of two tasks' weighted gradients.
@pytest.mark.parametrize("case", ["last_shared", "shared_rep", "skip", "shared_head"])
def test_network_gets_only_the_weighted_sum_gradient(case: str):
    model, (x, y) = make_model(), batch()
    if case == "shared_rep":
        bal = GradNorm(list(TASKS), grad_source="shared_rep")
    else:
        bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)
    w0 = torch.tensor([0.2, 2.0, 0.8])
    bal.weights.copy_(w0)

    def losses_of_case():
        out, losses = model_losses(model, x, y)
        if case == "skip":
            losses["a"] = losses["a"] + model.trunk[0].weight.square().sum()
        if case == "shared_head":
            losses["c"] = losses["c"] + model.heads["a"](out.shared).square().mean()
        return out, losses

    out, losses = losses_of_case()
    metrics = bal.backward(losses, out.shared)
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _, losses = losses_of_case()
    sum(w0[i] * losses[t] for i, t in enumerate(TASKS)).backward()
    for g, ref in zip(got, (p.grad for p in model.parameters())):
        torch.testing.assert_close(g, ref)
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == pytest.approx(w0.tolist())
    assert not torch.equal(bal.weights, w0)


def test_all_norm_paths_agree():
    model, (x, y) = make_model(), batch()
    layer = model.last_shared_layer
    variants = {
        "linear": GradNorm(list(TASKS), shared_layer=layer),
        "params": GradNorm(list(TASKS), shared_params=layer.parameters()),
        "module": GradNorm(list(TASKS), shared_layer=nn.Sequential(layer)),  # not a Linear: generic path
    }
    results = {}
    for name, bal in variants.items():
        model.zero_grad()
        out, losses = model_losses(model, x, y)
        metrics = bal.backward(losses, out.shared)
        results[name] = torch.stack([metrics[f"grad_norm/{t}"] for t in TASKS])
    torch.testing.assert_close(results["params"], results["module"])
    torch.testing.assert_close(results["linear"], results["params"], rtol=1e-5, atol=1e-7)

    out, losses = model_losses(model, x, y)
    expected = [torch.autograd.grad(losses[t], out.shared, retain_graph=True)[0].norm().item() for t in TASKS]
    rep = GradNorm(list(TASKS), grad_source="shared_rep").backward(losses, out.shared)
    assert [rep[f"grad_norm/{t}"].item() for t in TASKS] == pytest.approx(expected, rel=1e-6)


def test_weights_stay_positive_and_sum_to_task_count():
    model = make_model()
    bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer, alpha=0.12, lr=0.5)
    for step in range(3):
        train(model, bal, range(step, step + 1))
        assert (bal.weights > 0).all() and bal.weights.sum().item() == pytest.approx(3.0)
    assert bal.initialized.item()


def test_initial_losses_first_step_or_theoretical():
    model, (x, y) = make_model(), batch()
    bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)
    out, losses = model_losses(model, x, y)
    first = bal.backward(losses, out.shared)
    assert all(first[f"gradnorm/loss_ratio/{t}"].item() == pytest.approx(1.0) for t in TASKS)

    log10 = {t: math.log(10) for t in TASKS}
    bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer, initial_losses=log10)
    out, losses = model_losses(model, x, y)
    given = bal.backward(losses, out.shared)
    for t in TASKS:
        assert given[f"gradnorm/loss_ratio/{t}"].item() == pytest.approx(losses[t].item() / math.log(10))
    assert bal.initial_losses.tolist() == pytest.approx([math.log(10)] * 3)


def test_state_dict_round_trip_continues_identically():
    model = make_model()
    bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)
    train(model, bal, range(2))
    saved_model, saved_bal = copy.deepcopy(model.state_dict()), copy.deepcopy(bal.state_dict())
    assert {"weights", "exp_avg", "exp_avg_sq", "opt_step", "initial_losses", "initialized"} <= set(saved_bal)
    straight = train(model, bal, range(2, 4))

    resumed_model = make_model(seed=7)
    resumed_model.load_state_dict(saved_model)
    resumed = GradNorm(list(TASKS), shared_layer=resumed_model.last_shared_layer)
    resumed.load_state_dict(saved_bal)
    again = train(resumed_model, resumed, range(2, 4))
    for key in straight:
        assert torch.equal(again[key], straight[key]), key
    for key, value in bal.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_grad_scaler_gives_fp32_weights_and_skipped_steps_change_nothing():
    model = make_model()
    reference = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)
    train(model, reference, range(3))
    model = make_model()
    bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)
    train(model, bal, range(3), torch.amp.GradScaler("cpu", init_scale=2.0**12))
    torch.testing.assert_close(bal.weights, reference.weights, rtol=1e-5, atol=1e-6)

    # A skipped first step must not even record L_i(0).
    model = make_model()
    bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)
    before = copy.deepcopy(bal.state_dict())
    scaler, opt = torch.amp.GradScaler("cpu"), torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    out, losses = model_losses(model, x, y)
    bal.backward(losses, out.shared, scaler)
    model.trunk[0].weight.grad[0, 0] = float("nan")
    scaler.step(opt)
    scaler.update()
    bal.step()
    for key, value in bal.state_dict().items():
        assert torch.equal(value, before[key]), key
    opt.zero_grad()
    out, losses = model_losses(model, x, y)
    bal.backward(losses, out.shared, scaler)
    scaler.step(opt)
    scaler.update()
    bal.step()
    assert bal.initialized.item() and not torch.equal(bal.weights, before["weights"])


def test_fp16_autocast_with_scaler_measures_like_fp32():
    model, (x, y) = make_model(), batch()
    reference = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)
    out, losses = model_losses(model, x, y)
    expected = reference.backward(losses, out.shared)
    reference.remove_hook()
    model.zero_grad()
    bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
        losses = {k: F.mse_loss(out.preds[k].float(), y[k]) for k in TASKS}
    assert out.shared.dtype == torch.float16
    metrics = bal.backward(losses, out.shared, scaler)
    for key in expected:
        if not key.startswith("weight/"):
            torch.testing.assert_close(metrics[key], expected[key], rtol=2e-2, atol=1e-4)


def test_per_task_mode_gives_the_joint_update():
    x, y = batch()
    joint_model = make_model()
    joint = GradNorm(list(TASKS), shared_layer=joint_model.last_shared_layer)
    out, losses = model_losses(joint_model, x, y)
    expected = joint.backward(losses, out.shared)

    model = make_model()
    bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)
    metrics: dict[str, torch.Tensor] = {}
    for task in ("c", "a", "b"):
        out, losses = model_losses(model, x, y)
        metrics |= bal.backward_task(task, losses[task], out.shared)
    assert torch.equal(bal.weights, torch.ones(3))
    metrics |= bal.step()
    assert metrics.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(metrics[key], expected[key], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(bal.weights, joint.weights)
    for g, ref in zip((p.grad for p in model.parameters()), (p.grad for p in joint_model.parameters())):
        torch.testing.assert_close(g, ref)


def test_hot_path_has_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    model, (x, y) = make_model(), batch()
    bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)
    scaler = torch.amp.GradScaler("cpu")
    with no_host_sync(monkeypatch):
        out, losses = model_losses(model, x, y)
        bal.backward(losses, out.shared, scaler)
        bal.step()
        for task in TASKS:
            out, losses = model_losses(model, x, y)
            bal.backward_task(task, losses[task], out.shared, scaler)
        bal.step()


def test_metrics_are_0d_tensors_under_tensorboard_tags():
    model, (x, y) = make_model(), batch()
    bal = GradNorm(list(TASKS), shared_layer=model.last_shared_layer)  # before the forward: it hooks the layer
    out, losses = model_losses(model, x, y)
    metrics = bal.backward(losses, out.shared)
    families = ("weight", "grad_norm", "gradnorm/norm_share", "gradnorm/target", "gradnorm/loss_ratio")
    assert set(metrics) == {f"{f}/{t}" for f in families for t in TASKS} | {"gradnorm/L_grad"}
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())


def test_bad_setups_fail_clearly():
    layer = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="shared_layer: grad_source"):
        GradNorm(["a", "b"])
    with pytest.raises(ValueError, match="grad_source"):
        GradNorm(["a", "b"], shared_layer=layer, grad_source="trunk")
    with pytest.raises(ValueError, match="initial_losses"):
        GradNorm(["a", "b"], shared_layer=layer, initial_losses={"a": 1.0})
    with pytest.raises(ValueError, match=r"^initial_losses\.b: must be a number > 0, got 0"):
        GradNorm(["a", "b"], shared_layer=layer, initial_losses={"a": 1.0, "b": 0})
    with pytest.raises(ValueError, match=r"^betas: must be two numbers in \[0, 1\), got \(0\.9, 1\)"):
        GradNorm(["a", "b"], shared_layer=layer, betas=(0.9, 1))  # a new check: Adam's betas, as FAMO's and UW's
    with pytest.raises(ValueError, match=r"^eps: must be a number > 0, got 0"):
        GradNorm(["a", "b"], shared_layer=layer, eps=0)
    bal = GradNorm(["a", "b"], shared_layer=layer)
    shared = torch.ones(1, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match="ran no forward"):
        bal.backward({"a": shared.sum(), "b": shared.sum()}, shared)
    with torch.no_grad():
        layer(torch.ones(1, 2))  # an evaluation forward is not captured
    assert bal._io is None
