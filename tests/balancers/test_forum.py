"""FORUM: the update by hand, the program against cvxpy, exactness against LibMTL main's FORUM (its
`bacth_forward_FORUM` copied below from LibMTL/trainer.py at commit 4336804847eaa5e0b924b743d76beec7ac3fdc97),
the epoch's rate, resume through the engine, refusals."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtl_bench.balancers import FORUM, BackwardContext, forum
from mtl_bench.balancers.forum import forum_weights
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError
from tests.helpers.balancer_kit import TASKS, X, Y, pair_model, pair_rows
from tests.helpers.cli import SMALL, run_cli
from tests.helpers.validation import GivenBatches, model_batches

# ---------------------------------------------------------------------------------------------- the formula


@pytest.mark.parametrize("epoch", [0, 3])
def test_one_step_by_hand_on_quadratic_losses(epoch):
    """θ = 0.5; training losses L_a = (θ−1)², L_b = (θ+1)²; validation losses (θ−2)², θ²; one inner step of lr 0.1.
    softmax(α) = z = (1/2, 1/2), L = (0.25, 2.25): g_f = (z∘(L − z·L), ∂_θ f) = (−0.5, 0.5, 1); θ¹ = 0.4,
    L̂ = (0.36, 1.96): ∇_α f(θ¹) = (−0.4, 0.4), so g_q = (−0.1, 0.1, 1), ‖g_q‖² = 1.02. The validation gradients
    (−3, 1) normalize to g_F = (0, 0, −1), (0, 0, 1): π = φ ± 1/(1.02 + 1e-8). With w = (u, 1 − u, s) the program
    is min 0.02 s² + (1 − 2u + s)² − φ(1.02 + 1e-8) s over u ∈ [0, 1], s ≥ max(0, u π_a + (1 − u) π_b): at
    φ = 0.1 its minimum lies at u = 1 and s = π_a (the cone constraint holds it above its free optimum
    (2 + 0.102)/2.04 ≈ 1.03 < π_a ≈ 1.08). λ = (1, 0)/(epoch + 1)^(3/4), ν = λ·π = π_a·λ_a, the direction
    λ_a g_F_a + ν g_q: θ's gradient λ_a(π_a − 1), α's ν(−0.1, 0.1), whose first Adam step moves each logit by
    outer_lr against its sign (times |g|/(|g| + 1e-8))."""
    theta = nn.Parameter(torch.tensor(0.5, dtype=torch.float64))
    centers = {"train": {"a": 1.0, "b": -1.0}, "val": {"a": 2.0, "b": 0.0}}

    def task_losses(inputs, targets, params=None):
        t = theta if params is None else params["theta"]
        return {k: (t - c) ** 2 for k, c in centers[inputs].items()}

    source = GivenBatches(task_losses, {"theta": theta}, lr=0.1).feed(("train", {}), ("val", {}))
    bal = FORUM(list(TASKS), outer_lr=0.1, inner_lr=0.1, inner_step=1, phi=0.1, validation=source).double()
    metrics = bal.backward(task_losses("train", {}), theta, BackwardContext(epoch=epoch))
    bal.step()
    pi_a = 0.1 + 1 / (1.02 + 1e-8)
    lam = 1 / (epoch + 1) ** 0.75
    assert bal.weighting.lambdas.tolist() == pytest.approx([lam, 0.0], abs=1e-9)
    assert theta.grad.item() == pytest.approx(lam * (pi_a - 1), abs=1e-9)
    g = lam * pi_a * 0.1
    delta = 0.1 * g / (g + 1e-8)
    assert bal.weighting.logits.tolist() == pytest.approx([0.5 + delta, 0.5 - delta], abs=1e-9)
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == [0.5, 0.5]  # softmax(α) used in the step


def random_program(t: int, seed: int, phi: float = 0.1):
    """A program as FORUM builds it: T unit rows zero in α, g_q, π and the constant."""
    rng = np.random.default_rng(seed)
    g_f = rng.normal(size=(t, 40))
    g_f = np.concatenate([np.zeros((t, t)), g_f / np.linalg.norm(g_f, axis=1, keepdims=True)], axis=1)
    g_q = np.append(rng.normal(size=t) * 0.1, rng.normal(size=40) * rng.uniform(0.2, 2))
    q = g_q @ g_q + 1e-8
    a = np.vstack([g_f, g_q])
    return a @ a.T, phi - g_f @ g_q / q, phi * q


def libmtl_program(gram, pi, w_constant):
    """LibMTL's cvxpy program, as in `bacth_forward_FORUM` (the eigen square root, its default solver)."""
    cp = pytest.importorskip("cvxpy")
    n = len(pi)
    c, v = np.linalg.eig(gram)
    gg_sqrt = v @ np.diag(np.sqrt(np.maximum(c, 0))) @ np.linalg.inv(v)
    g_cp = cp.Parameter(shape=(n + 1, n + 1), value=gg_sqrt)
    w_cp = cp.Variable(shape=(n + 1), nonneg=True)
    constraints = [cp.sum(w_cp[:-1]) == 1, w_cp[-1] >= cp.sum([w_cp[tn] * pi[tn] for tn in range(n)]), w_cp >= 0]
    prob = cp.Problem(cp.Minimize(cp.quad_over_lin(g_cp @ w_cp, 1) - w_cp[-1] * w_constant), constraints)
    prob.solve()
    return w_cp.value


@pytest.mark.parametrize(("t", "seed"), [(2, 0), (2, 1), (3, 2), (3, 3), (5, 4), (10, 5), (10, 6)])
def test_the_program_reaches_cvxpys_minimum(t, seed):
    """Same minimum as LibMTL's cvxpy program (to 1e-8), feasible (to 1e-9); at T <= 5 the same w (1e-6): at
    T = 10 the program is flat along some direction and two solvers' w differ by up to ~1e-5."""
    gram, pi, w_constant = random_program(t, seed)
    ours, theirs = forum_weights(gram, pi, w_constant), libmtl_program(gram, pi, w_constant)

    def objective(w):
        return w @ gram @ w - w_constant * w[-1]

    assert objective(ours) <= objective(theirs) + 1e-8
    assert ours.min() >= -1e-9 and abs(ours[:-1].sum() - 1) < 1e-9 and ours[-1] >= pi @ ours[:-1] - 1e-9
    if t <= 5:
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_a_program_that_is_not_finite_or_an_infeasible_answer_gives_nans(monkeypatch):
    gram, pi, w_constant = random_program(3, 0)
    bad = gram.copy()
    bad[0, 0] = np.nan
    assert np.isnan(forum_weights(bad, pi, w_constant)).all()
    right = forum_weights(gram, pi, w_constant)
    for answer in (right + np.array([0.01, 0, 0, 0]), right * np.array([1, 1, 1, -1]) - 1):  # Σ ≠ 1; cone, w < 0
        monkeypatch.setattr(forum, "minimize", lambda *args, answer=answer, **kwargs: SimpleNamespace(x=answer))
        assert np.isnan(forum_weights(gram, pi, w_constant)).all()


# ---------------------------------------------------------------------------------------------- the reference


class Meter:
    def update(self, *args):
        pass


class LibMTLForum:
    """The `self` LibMTL's FORUM reads: one model (float64), its SGD, the task logits (`_prepare_tw`'s TW, in
    float64 here) and their Adam, forward4loss for a single-input task set (stacked MSE losses)."""

    def __init__(self, model: nn.Module, tasks, outer_lr: float, inner_lr: float, inner_step: int, phi: float, lr):
        self.model, self.task_name, self.task_num = model, list(tasks), len(tasks)
        self.device, self.multi_input, self.meter = torch.device("cpu"), False, Meter()
        self.kwargs = {"weight_args": {"FORUM_phi": phi, "inner_step": inner_step, "inner_lr": inner_lr}}
        self.tw = TW(self.task_num)
        self.tw_optimizer = torch.optim.Adam(self.tw.parameters(), lr=outer_lr)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def forward4loss(self, model, x, y, return_preds=False):
        out = model(x)
        losses = torch.stack([F.mse_loss(out.preds[t], y[t]) for t in self.task_name])
        return (losses, out.preds) if return_preds else losses


class TW(nn.Module):  # LibMTL's `_prepare_tw`: logits at 1/T, softmax-weighted sum
    def __init__(self, task_num):
        super().__init__()
        self.weights = nn.Parameter(torch.full((task_num,), 1 / task_num, dtype=torch.float64))

    def forward(self, loss):
        weight = F.softmax(self.weights, dim=-1)
        return torch.sum(torch.mul(weight, loss))


def bacth_forward_FORUM(self, inner_x, inner_y, outer_x, outer_y, lambda_buffer, epoch):
    # LibMTL/trainer.py, commit 4336804847eaa5e0b924b743d76beec7ac3fdc97, lines 614-722, as written there
    # (`cp` imported here; its docstring, the meter's multi-input branch and two commented-out prints left out).
    import cvxpy as cp

    phi = self.kwargs["weight_args"]["FORUM_phi"]
    inner_step = self.kwargs["weight_args"]["inner_step"]
    inner_lr = self.kwargs["weight_args"]["inner_lr"]

    grad_index = []
    for param in self.model.parameters():
        grad_index.append(param.data.numel())

    # LL f(alpha, omega)
    train_losses, train_preds = self.forward4loss(self.model, inner_x, inner_y, return_preds=True)
    if not self.multi_input:
        self.meter.update(train_preds, inner_y)
    loss = self.tw(train_losses)
    # grad from f(alpha, omega)
    g_f = torch.autograd.grad(loss, list(self.tw.parameters()) + list(self.model.parameters()))
    g_f = torch.cat([g.view(-1) for g in g_f])

    # f(alpha, omega^T)
    inner_model = copy.deepcopy(self.model)
    inner_optim = torch.optim.SGD(inner_model.parameters(), lr=inner_lr, weight_decay=0)
    for i in range(inner_step):
        train_losses = self.forward4loss(inner_model, inner_x, inner_y)
        loss = self.tw(train_losses)
        if loss.item() > 1e5:  # caused by too large inner_lr and inner_step
            break
        inner_optim.zero_grad()
        loss.backward()
        inner_optim.step()
        self.tw_optimizer.zero_grad()

    # grad from f^hat(alpha, omega^T)
    train_losses = self.forward4loss(inner_model, inner_x, inner_y)
    loss = self.tw(train_losses)
    g_f_hat_alpha = torch.autograd.grad(loss, self.tw.parameters())
    g_f_hat_alpha = torch.cat([g.view(-1) for g in g_f_hat_alpha])

    # grad from q_beta
    g_q_beta = copy.deepcopy(g_f)
    g_q_beta[: self.task_num] = g_q_beta[: self.task_num] - g_f_hat_alpha  # size: [d]

    # F(omega)
    train_losses = self.forward4loss(self.model, outer_x, outer_y)
    g_F_omega_list = []
    for tn, task in enumerate(self.task_name):
        g_F_omega_tn = torch.autograd.grad(train_losses[tn], self.model.parameters(), retain_graph=True)
        g_F_omega_list.append(torch.cat([g.view(-1) for g in g_F_omega_tn]))
    g_F_omega_list = torch.stack(g_F_omega_list)
    # normalize g_F_omega_list
    gn = g_F_omega_list.pow(2).sum(-1).sqrt()
    g_F_omega_list = g_F_omega_list / gn.unsqueeze(1).repeat(1, g_F_omega_list.size()[1])

    g_F_omega_list = torch.cat([torch.zeros(self.task_num, self.task_num).to(self.device), g_F_omega_list], dim=1)

    # pi
    pi = []
    for tn in range(self.task_num):
        pi.append(phi - ((g_q_beta * g_F_omega_list[tn]).sum() / (g_q_beta.norm().pow(2) + 1e-8)).item())

    w_constant = phi * (g_q_beta.norm().pow(2) + 1e-8).item()

    # A
    A = torch.cat([g_F_omega_list, g_q_beta.unsqueeze(0)], dim=0)  # (task_num+1) x d
    AAT = (A @ A.t()).detach().cpu().numpy()

    c, v = np.linalg.eig(AAT)
    gg_sqrt = v @ np.diag(np.sqrt(np.maximum(c, 0))) @ np.linalg.inv(v)
    g_cp = cp.Parameter(shape=(self.task_num + 1, self.task_num + 1), value=gg_sqrt)
    w_cp = cp.Variable(shape=(self.task_num + 1), nonneg=True)
    constraints = [
        cp.sum(w_cp[:-1]) == 1,
        w_cp[-1] >= cp.sum([w_cp[tn] * pi[tn] for tn in range(self.task_num)]),
        w_cp >= 0,
    ]
    prob = cp.Problem(cp.Minimize(cp.quad_over_lin(g_cp @ w_cp, 1) - w_cp[-1] * w_constant), constraints)
    prob.solve()
    w_cpu = w_cp.value

    # EMA lambda
    for tn in range(self.task_num):
        lambda_buffer[tn] = lambda_buffer[tn] + (1 / (epoch + 1) ** (3 / 4)) * (w_cpu[tn] - lambda_buffer[tn])

    nu = max(sum([lambda_buffer[tn] * pi[tn] for tn in range(self.task_num)]), 0)
    g_final = sum([lambda_buffer[tn] * g_F_omega_list[tn] for tn in range(self.task_num)]) + nu * g_q_beta

    self.tw_optimizer.zero_grad()
    for param in self.tw.parameters():
        param.grad = g_final[: self.task_num]

    self.optimizer.zero_grad()
    count = 0
    for param in self.model.parameters():
        beg = 0 if count == 0 else sum(grad_index[:count])
        end = sum(grad_index[: (count + 1)])
        param.grad = g_final[self.task_num :][beg:end].contiguous().view(param.data.size()).data.clone()
        count += 1

    self.tw_optimizer.step()
    self.optimizer.step()
    return lambda_buffer


LibMTLForum.bacth_forward_FORUM = bacth_forward_FORUM  # the source's method, on this stand-in


def batch_at(rows: list[int], dtype=torch.float64):
    return X[rows].to(dtype), {t: Y[t][rows].to(dtype) for t in TASKS}


def val_rows(step: int) -> list[int]:
    return [(5 * step + 2 + i) % 8 for i in range(3)]


EPOCHS = [0, 0, 1, 1, 2, 3]  # two steps per epoch, then one: the λ average at rates 1, 2^-3/4, 3^-3/4, 4^-3/4


def ours_after(steps: int, outer_lr: float, inner_lr: float, inner_step: int, dtype=torch.float64, scaler=None):
    model = pair_model().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    source = model_batches(model, TASKS, opt)
    bal = FORUM(list(TASKS), outer_lr=outer_lr, inner_lr=inner_lr, inner_step=inner_step, validation=source).to(dtype)
    for step in range(steps):
        inputs, targets = batch_at(pair_rows(step), dtype)
        source.feed((inputs, targets), batch_at(val_rows(step), dtype))
        opt.zero_grad()
        out = model(inputs)
        ctx = BackwardContext(scaler=scaler, epoch=EPOCHS[step])
        bal.backward({t: F.mse_loss(out.preds[t], targets[t]) for t in TASKS}, out.shared, ctx)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        bal.step()
    return model, bal


@pytest.mark.parametrize(("outer_lr", "inner_lr", "inner_step"), [(1e-3, 0.1, 5), (0.3, 0.5, 2), (0.05, 0.3, 3)])
def test_parameters_weights_and_lambdas_equal_libmtl_after_six_steps(outer_lr, inner_lr, inner_step):
    """Same model, initial parameters and batches (their inner batch: our step's batch; their outer batch: our
    validation batch), float64; their program solved by cvxpy, ours by SLSQP, hence a tolerance of 1e-6."""
    pytest.importorskip("cvxpy")
    steps = len(EPOCHS)
    ref = LibMTLForum(pair_model().double(), TASKS, outer_lr, inner_lr, inner_step, 0.1, lr=0.1)
    lambda_buffer = np.zeros(len(TASKS))
    for step in range(steps):
        inner, outer = batch_at(pair_rows(step)), batch_at(val_rows(step))
        lambda_buffer = ref.bacth_forward_FORUM(*inner, *outer, lambda_buffer, EPOCHS[step])

    model, bal = ours_after(steps, outer_lr, inner_lr, inner_step)
    torch.testing.assert_close(bal.weighting.lambdas, torch.as_tensor(lambda_buffer), rtol=0, atol=1e-6)
    torch.testing.assert_close(bal.weighting.logits, ref.tw.weights.detach(), rtol=0, atol=1e-6)
    assert not torch.allclose(bal.weighting.logits, torch.full((2,), 0.5, dtype=torch.float64))  # the weights moved
    assert 0 < bal.weighting.lambdas.sum() <= 1 + 1e-9
    for (name, ours), theirs in zip(model.named_parameters(), ref.model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6, msg=name)


def test_inner_steps_stop_once_f_exceeds_1e5_as_libmtls_loop_breaks():
    """At inner_lr 20 on the first batch f is 2.2, 74, 4.1e4, 5.1e6 after 0-3 SGD steps: LibMTL's loop takes 3
    steps and breaks at the fourth check, so with inner_step 4 or 10 ∇_α f is taken at the third iterate, as with
    inner_step 3 (the last forward at the inner parameters). LibMTL's cvxpy program fails on the huge gradients
    that follow, hence no comparison with its numbers here."""
    last = {}
    for inner_step in (2, 3, 4, 10):
        model = pair_model().double()
        inputs, targets = batch_at(pair_rows(0))
        of_model = model_batches(model, TASKS, lr=0.1)
        losses_at = of_model.task_losses
        seen = []

        def recording(x, y, params=None, losses_at=losses_at, seen=seen):
            if params is not None:
                seen.append({name: p.detach().clone() for name, p in params.items()})
            return losses_at(x, y, params)

        source = GivenBatches(recording, of_model.params, lr=0.1).feed((inputs, targets), batch_at(val_rows(0)))
        out = model(inputs)
        FORUM(list(TASKS), inner_lr=20.0, inner_step=inner_step, validation=source).double().backward(
            {t: F.mse_loss(out.preds[t], targets[t]) for t in TASKS}, out.shared, BackwardContext()
        )
        assert len(seen) == inner_step + 1
        last[inner_step] = torch.cat([p.reshape(-1) for p in seen[-1].values()])
        with torch.no_grad():
            f = 0.5 * sum(losses_at(inputs, targets, seen[-1]).values())
        assert (f > 1e5) == (inner_step >= 3), (inner_step, f)
    assert torch.equal(last[4], last[3]) and torch.equal(last[10], last[3])
    assert not torch.allclose(last[2], last[3])


# ---------------------------------------------------------------------------------------------- the contract


def test_grad_scaler_gives_the_fp32_update():
    """Under a GradScaler every gradient is taken through the scale and divided by it; the direction is
    written through ctx.scale and unscaled by the scaler's step."""
    model, bal = ours_after(4, 0.3, 0.1, 2, torch.float32)
    scaled_model, scaled_bal = ours_after(
        4, 0.3, 0.1, 2, torch.float32, torch.amp.GradScaler("cpu", init_scale=2.0**12)
    )
    torch.testing.assert_close(scaled_bal.weighting.logits, bal.weighting.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(scaled_bal.weighting.lambdas, bal.weighting.lambdas, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), scaled_model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


def test_resumed_run_ends_like_the_uninterrupted_one(compose_cfg, tmp_path):
    """30 steps at 14 per epoch: the λ average crosses two epochs, the resumed run starts inside the second."""
    args = [*SMALL, "balancer=forum", "balancer.outer_lr=0.05", "balancer.inner_step=2"]
    train(compose_cfg(*args, "trainer.max_steps=30"), tmp_path / "straight")
    train(compose_cfg(*args, "trainer.max_steps=17"), tmp_path / "resumed")
    train(compose_cfg(*args, "trainer.max_steps=30", "trainer.resume=auto"), tmp_path / "resumed")
    straight, resumed = (json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("straight", "resumed"))
    assert resumed["step"] == straight["step"] == 30
    assert resumed["test"] == straight["test"]
    states = [
        torch.load(tmp_path / run / "checkpoints" / "last.pt", weights_only=True)["balancer"]
        for run in ("straight", "resumed")
    ]
    assert set(states[0]) == {f"weighting.{k}" for k in ("logits", "exp_avg", "exp_avg_sq", "opt_step", "lambdas")}
    for key, value in states[0].items():
        assert torch.equal(states[1][key], value), key
    assert states[0]["weighting.opt_step"].item() == 30 and not torch.equal(
        states[0]["weighting.logits"], torch.full((2,), 0.5)
    )


def test_a_skipped_step_keeps_logits_and_lambdas():
    model = pair_model()
    inputs, targets = batch_at(pair_rows(0), torch.float32)
    source = model_batches(model, TASKS, lr=0.1).feed((inputs, targets), batch_at(val_rows(0), torch.float32))
    bal = FORUM(list(TASKS), outer_lr=0.3, validation=source)
    out = model(inputs)
    bal.backward({t: F.mse_loss(out.preds[t], targets[t]) for t in TASKS}, out.shared, BackwardContext())
    bal.step(torch.tensor(True))
    assert torch.equal(bal.weighting.logits, torch.full((2,), 0.5)) and torch.equal(
        bal.weighting.lambdas, torch.zeros(2)
    )
    assert bal.weighting.opt_step.item() == 0


def test_the_smoke_command_trains_and_reports_the_weights(tmp_path):
    """`mtl-bench train balancer=forum trainer=smoke` as typed, on the default task set (10,000 rows)."""
    result = run_cli("train", "balancer=forum", "trainer=smoke", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "completed"
    assert "final loss weights: t0 " in result.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.step_mode=per_task"], "trainer.step_mode=per_task: FORUM has no per-task mode"),
        (["trainer.grad_accumulation_steps=2"], "trainer.grad_accumulation_steps=2: FORUM takes its inner steps"),
        (["balancer.outer_lr=0"], "balancer.outer_lr: must be a number > 0"),
        (["balancer.inner_lr=-1"], "balancer.inner_lr: must be a number > 0"),
        (["balancer.inner_step=0"], "balancer.inner_step: must be an integer >= 1, got 0"),
        (["balancer.inner_step=1.5"], "balancer.inner_step: expected int, got 1.5"),
        (["balancer.phi=-0.1"], "balancer.phi: must be a finite number >= 0"),
        (["+balancer.inner_steps=3"], "balancer.inner_steps"),
    ],
)
def test_meaningless_settings_stop_in_one_line_before_training(compose_cfg, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        train(compose_cfg(*SMALL, "balancer=forum", *overrides), tmp_path)
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_several_processes_and_a_missing_validation_source_are_refused():
    with pytest.raises(ValueError, match="^world_size: FORUM runs in one process"):
        FORUM(list(TASKS), world_size=2)
    with pytest.raises(ValueError, match="^validation: FORUM learns on validation batches; pass an object"):
        FORUM(list(TASKS))
