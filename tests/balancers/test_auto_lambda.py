"""Auto-λ: the update by hand, exactness against LibMTL main's AutoLambda (its update reimplemented here from
LibMTL/trainer.py at commit 4336804847eaa5e0b924b743d76beec7ac3fdc97), resume through the engine, refusals."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtl_bench.balancers import AutoLambda, BackwardContext
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError
from tests.helpers.balancer_kit import TASKS, X, Y, no_host_sync, pair_model, pair_rows
from tests.helpers.cli import SMALL, run_cli
from tests.helpers.validation import GivenBatches, model_batches

# ---------------------------------------------------------------------------------------------- the formula


def test_one_step_by_hand_on_quadratic_losses():
    """θ = 0.5; training losses L_a = (θ−1)², L_b = (θ+1)²; validation losses (θ−2)², θ²; η = 0.1.
    λ = (1/2, 1/2): ∇_θ Σ λ L = 2θ = 1, θ' = 0.4; d = 2(θ'−2) + 2θ' = −2.4. Central differences are exact on
    quadratics: ∇L_i·d = (2·(−0.5)·(−2.4), 2·1.5·(−2.4)) = (2.4, −7.2); h = λ∘(g − λ·g) = (2.4, −2.4);
    α's gradient −ηh = (−0.24, 0.24): Adam's first step moves each logit against its sign by
    δ = outer_lr·0.24/(0.24 + 1e-8) (its eps); λ = softmax(α) = (σ(2δ), σ(−2δ)); θ's gradient
    λ_a·2(θ−1) + λ_b·2(θ+1)."""
    theta = nn.Parameter(torch.tensor(0.5, dtype=torch.float64))
    centers = {"train": {"a": 1.0, "b": -1.0}, "val": {"a": 2.0, "b": 0.0}}

    def task_losses(inputs, targets, params=None):
        t = theta if params is None else params["theta"]
        return {k: (t - c) ** 2 for k, c in centers[inputs].items()}

    source = GivenBatches(task_losses, {"theta": theta}, lr=0.1).feed(("train", {}), ("val", {}))
    bal = AutoLambda(list(TASKS), outer_lr=0.1, validation=source).double()
    metrics = bal.backward(task_losses("train", {}), theta, BackwardContext())
    bal.step()
    delta = 0.1 * 0.24 / (0.24 + 1e-8)
    assert bal.weighting.logits.tolist() == pytest.approx([0.5 + delta, 0.5 - delta], abs=1e-12)
    sig = 1 / (1 + math.exp(-2 * delta))
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == pytest.approx([sig, 1 - sig], abs=1e-12)
    assert theta.grad.item() == pytest.approx(sig * -1.0 + (1 - sig) * 3.0, abs=1e-12)


# ---------------------------------------------------------------------------------------------- the reference


def batch_at(rows: list[int]):
    return X[rows].double(), {t: Y[t][rows].double() for t in TASKS}


def val_rows(step: int) -> list[int]:
    return [(5 * step + 2 + i) % 8 for i in range(3)]


class LibMTLAutoLambda:
    """LibMTL main's `Trainer._prepare_tw` and `Trainer.bacth_forward_AutoLambda` (LibMTL/trainer.py, commit
    4336804847eaa5e0b924b743d76beec7ac3fdc97), restated for one model and MSE task losses. Their
    `forward4loss` fills a float32 `torch.zeros(task_num)` only for multi-input task sets; single-input
    returns the stacked losses, as here. Their inner, outer and training batches are arguments."""

    def __init__(self, model: nn.Module, tasks: tuple[str, ...], outer_lr: float, lr: float) -> None:
        self.model, self.tasks = model, tasks
        self.tw = nn.Parameter(torch.full((len(tasks),), 1 / len(tasks), dtype=torch.float64))
        self.tw_optimizer = torch.optim.Adam([self.tw], lr=outer_lr)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def forward4loss(self, model, x, y):
        out = model(x)
        return torch.stack([F.mse_loss(out.preds[t], y[t]) for t in self.tasks])

    def weighted(self, losses):  # their TW.forward
        return torch.sum(torch.mul(F.softmax(self.tw, dim=-1), losses))

    def compute_hessian(self, grads, inner_x, inner_y):
        norm = torch.cat([g.view(-1) for g in grads]).norm()
        eps = 0.01 / norm
        with torch.no_grad():
            for p, d in zip(self.model.parameters(), grads):
                p += eps * d
        d_weight_p = torch.autograd.grad(self.weighted(self.forward4loss(self.model, inner_x, inner_y)), [self.tw])
        with torch.no_grad():
            for p, d in zip(self.model.parameters(), grads):
                p -= 2 * eps * d
        d_weight_n = torch.autograd.grad(self.weighted(self.forward4loss(self.model, inner_x, inner_y)), [self.tw])
        with torch.no_grad():
            for p, d in zip(self.model.parameters(), grads):
                p += eps * d
        return [(p - n) / (2.0 * eps) for p, n in zip(d_weight_p, d_weight_n)]

    def step(self, inner, outer, all_) -> None:
        inner_lr = self.optimizer.param_groups[0]["lr"]
        meta_model = copy.deepcopy(self.model)
        loss = self.weighted(self.forward4loss(meta_model, *inner)).sum()
        grads = torch.autograd.grad(loss, meta_model.parameters())
        with torch.no_grad():
            for weight, grad in zip(meta_model.parameters(), grads):
                weight.copy_(weight - inner_lr * grad)
        loss = self.forward4loss(meta_model, *outer).sum()
        grads = torch.autograd.grad(loss, meta_model.parameters(), allow_unused=True)
        hessian = self.compute_hessian(grads, *inner)
        with torch.no_grad():
            self.tw.grad = -inner_lr * hessian[0]
        self.tw_optimizer.step()
        loss = self.weighted(self.forward4loss(self.model, *all_)).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.tw_optimizer.zero_grad()


# LibMTL main's own `Trainer.bacth_forward_AutoLambda` (its source extracted from LibMTL/trainer.py at commit
# 4336804847eaa5e0b924b743d76beec7ac3fdc97 and called with a stand-in `self`: this model in float64, SGD lr 0.1, the
# batches below, no scheduler): its task logits `tw.weights` after 6 steps, per outer_lr. The restatement above
# gave the same bits, and the same parameters.
LIBMTL_LOGITS_AFTER_6 = {
    1e-3: [0.49437186062768684, 0.5056281393723131],
    0.3: [-1.166173337254841, 2.166173337254812],
}


@pytest.mark.parametrize("outer_lr", [1e-3, 0.3])
def test_parameters_and_weights_equal_libmtl_after_six_steps(outer_lr):
    """Same model, initial parameters and batches (their inner and training batch: our step's batch; their
    outer batch: our validation batch), float64 so that only the order of rounding differs."""
    lr, steps = 0.1, 6
    ref = LibMTLAutoLambda(pair_model().double(), TASKS, outer_lr, lr)
    for step in range(steps):
        batch = batch_at(pair_rows(step))
        ref.step(batch, batch_at(val_rows(step)), batch)

    model = pair_model().double()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    source = model_batches(model, TASKS, opt)
    bal = AutoLambda(list(TASKS), outer_lr=outer_lr, validation=source).double()
    for step in range(steps):
        inputs, targets = batch_at(pair_rows(step))
        source.feed((inputs, targets), batch_at(val_rows(step)))
        opt.zero_grad()
        out = model(inputs)
        bal.backward({t: F.mse_loss(out.preds[t], targets[t]) for t in TASKS}, out.shared, BackwardContext())
        opt.step()
        bal.step()
    torch.testing.assert_close(ref.tw.detach(), torch.tensor(LIBMTL_LOGITS_AFTER_6[outer_lr], dtype=torch.float64))
    torch.testing.assert_close(bal.weighting.logits, ref.tw.detach(), rtol=1e-9, atol=1e-12)
    assert not torch.allclose(bal.weighting.logits, torch.full((2,), 0.5, dtype=torch.float64))  # the weights moved
    for (name, ours), theirs in zip(model.named_parameters(), ref.model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12, msg=name)


# ---------------------------------------------------------------------------------------------- the contract


def test_grad_scaler_gives_the_fp32_update():
    """Under a GradScaler the look-ahead gradients are taken through the scale and divided by it."""
    results = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=2.0**12)):
        model = pair_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        source = model_batches(model, TASKS, opt)
        bal = AutoLambda(list(TASKS), outer_lr=0.3, validation=source)
        for step in range(4):
            inputs, targets = X[pair_rows(step)], {t: Y[t][pair_rows(step)] for t in TASKS}
            source.feed((inputs, targets), (X[val_rows(step)], {t: Y[t][val_rows(step)] for t in TASKS}))
            opt.zero_grad()
            out = model(inputs)
            bal.backward(
                {t: F.mse_loss(out.preds[t], targets[t]) for t in TASKS}, out.shared, BackwardContext(scaler=scaler)
            )
            if scaler is None:
                opt.step()
            else:
                scaler.step(opt)
                scaler.update()
            bal.step()
        results.append((bal.weighting.logits.clone(), [p.detach().clone() for p in model.parameters()]))
    (logits, params), (scaled_logits, scaled_params) = results
    torch.testing.assert_close(scaled_logits, logits, rtol=1e-5, atol=1e-6)
    for p, q in zip(params, scaled_params):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


def test_resumed_run_ends_like_the_uninterrupted_one(compose_cfg, tmp_path):
    args = [*SMALL, "balancer=auto_lambda", "balancer.outer_lr=0.05"]
    train(compose_cfg(*args, "trainer.max_steps=12"), tmp_path / "straight")
    train(compose_cfg(*args, "trainer.max_steps=6"), tmp_path / "resumed")
    train(compose_cfg(*args, "trainer.max_steps=12", "trainer.resume=auto"), tmp_path / "resumed")
    straight, resumed = (json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("straight", "resumed"))
    assert resumed["step"] == straight["step"] == 12
    assert resumed["test"] == straight["test"]
    states = [
        torch.load(tmp_path / run / "checkpoints" / "last.pt", weights_only=True)["balancer"]
        for run in ("straight", "resumed")
    ]
    assert set(states[0]) == {"weighting.logits", "weighting.exp_avg", "weighting.exp_avg_sq", "weighting.opt_step"}
    for key, value in states[0].items():
        assert torch.equal(states[1][key], value), key
    assert states[0]["weighting.opt_step"].item() == 12 and not torch.equal(
        states[0]["weighting.logits"], torch.full((2,), 0.5)
    )


def test_metrics_are_0_d_and_a_step_reads_nothing_from_the_device(monkeypatch: pytest.MonkeyPatch):
    model = pair_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    source = model_batches(model, TASKS, opt)
    bal = AutoLambda(list(TASKS), validation=source)
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu"))
    with no_host_sync(monkeypatch):
        for step in range(2):
            inputs, targets = X[pair_rows(step)], {t: Y[t][pair_rows(step)] for t in TASKS}
            source.feed((inputs, targets), (X[val_rows(step)], {t: Y[t][val_rows(step)] for t in TASKS}))
            out = model(inputs)
            metrics = bal.backward({t: F.mse_loss(out.preds[t], targets[t]) for t in TASKS}, out.shared, ctx)
            bal.step(False)
    assert set(metrics) == {"weight/a", "weight/b"} and all(v.dim() == 0 for v in metrics.values())


def test_the_smoke_command_trains_and_reports_the_weights(tmp_path):
    """`mtl-bench train balancer=auto_lambda trainer=smoke` as typed, on the default task set (10,000 rows)."""
    result = run_cli("train", "balancer=auto_lambda", "trainer=smoke", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "completed"
    assert "final loss weights: t0 " in result.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.step_mode=per_task"], "trainer.step_mode=per_task: AutoLambda has no per-task mode"),
        (["trainer.grad_accumulation_steps=2"], "trainer.grad_accumulation_steps=2: AutoLambda takes one"),
        (["balancer.outer_lr=0"], "balancer.outer_lr: must be a number > 0"),
        (
            ["trainer.validation_holdout=0.01"],
            "trainer.validation_source=holdout: trainer.validation_holdout=0.01 has 5 samples, fewer than "
            "trainer.batch_size=32",
        ),
    ],
)
def test_meaningless_settings_stop_in_one_line_before_training(compose_cfg, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        train(compose_cfg(*SMALL, "balancer=auto_lambda", *overrides), tmp_path)
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_several_processes_and_a_missing_validation_source_are_refused():
    with pytest.raises(ValueError, match="^world_size: AutoLambda runs in one process"):
        AutoLambda(list(TASKS), world_size=2)
    with pytest.raises(ValueError, match="^validation: AutoLambda learns on validation batches; pass an object"):
        AutoLambda(list(TASKS))
