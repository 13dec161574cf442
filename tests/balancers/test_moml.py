"""MOML: the update by hand, exactness against LibMTL main's MOML (its update reimplemented here from LibMTL/trainer.py
and LibMTL/weighting/MGDA.py at commit 4336804847eaa5e0b924b743d76beec7ac3fdc97), resume through the engine,
refusals."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtl_bench.balancers import MOML, BackwardContext
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError
from tests.helpers.balancer_kit import TASKS, TASKS3, X, Y, batch, make_model, pair_model, pair_rows
from tests.helpers.cli import SMALL, run_cli
from tests.helpers.validation import GivenBatches, model_batches

# ---------------------------------------------------------------------------------------------- the formula


def quadratic_step(val_centers: dict[str, float]):
    """θ = 0.5; training losses L_a = (θ−1)², L_b = (θ+1)²; validation losses (θ−c_t)²; inner_lr = 0.1, the
    optimizer's lr unused. λ = (1/2, 1/2), g_f = (2(θ−1), 2(θ+1)) = (−1, 3), θ' = 0.5 − 0.1·1 = 0.4."""
    theta = nn.Parameter(torch.tensor(0.5, dtype=torch.float64))
    centers = {"train": {"a": 1.0, "b": -1.0}, "val": val_centers}

    def task_losses(inputs, targets, params=None):
        t = theta if params is None else params["theta"]
        return {k: (t - c) ** 2 for k, c in centers[inputs].items()}

    source = GivenBatches(task_losses, {"theta": theta}, lr=1.0).feed(("train", {}), ("val", {}))
    bal = MOML(list(TASKS), inner_lr=0.1, outer_lr=0.1, validation=source).double()
    metrics = bal.backward(task_losses("train", {}), theta, BackwardContext())
    bal.step()
    return bal, metrics, theta


def test_one_step_by_hand_when_the_validation_losses_agree():
    """Validation centers (2, 1): g_F = (2(0.4−2), 2(0.4−1)) = (−3.2, −1.2). The softmax Jacobian at λ = (½, ½) is
    ¼[[1, −1], [−1, 1]], so g_fᵀJ = (−1, 1) and α's task gradients a_t = −0.1·g_F,t·(−1, 1) = (−0.32, 0.32) and
    (−0.12, 0.12): after l2 normalisation both are (−1, 1)/√2, MGDA's best pair puts 0.999 on the first (equal
    vectors) and the direction is (−1, 1)/√2. Adam's first step moves each logit against its sign by
    δ = 0.1·(1/√2)/(1/√2 + 1e-8); λ = (σ(2δ), σ(−2δ)); θ's gradient λ_a·2(θ−1) + λ_b·2(θ+1)."""
    bal, metrics, theta = quadratic_step({"a": 2.0, "b": 1.0})
    r = 1 / math.sqrt(2)
    delta = 0.1 * r / (r + 1e-8)
    assert bal.weighting.logits.tolist() == pytest.approx([0.5 + delta, 0.5 - delta], abs=1e-12)
    sig = 1 / (1 + math.exp(-2 * delta))
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == pytest.approx([sig, 1 - sig], abs=1e-12)
    assert theta.grad.item() == pytest.approx(sig * -1.0 + (1 - sig) * 3.0, abs=1e-12)


def test_one_step_by_hand_when_the_validation_losses_conflict():
    """Validation centers (2, 0): g_F = (−3.2, 0.8), a_t = (−0.32, 0.32) and (0.08, −0.08): opposite after
    normalisation, so the min-norm point is their midpoint (γ = −(−1 − 1)/(1 + 1 + 2) = ½), the direction is 0,
    and Adam's first step with a zero gradient leaves α (and λ = ½) unchanged; its step count still advances."""
    bal, metrics, theta = quadratic_step({"a": 2.0, "b": 0.0})
    assert bal.weighting.logits.tolist() == [0.5, 0.5]
    assert bal.weighting.opt_step.item() == 1
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == [0.5, 0.5]
    assert theta.grad.item() == pytest.approx(0.5 * -1.0 + 0.5 * 3.0, abs=1e-12)


# ---------------------------------------------------------------------------------------------- the reference


def find_min_norm_element(grads):
    """LibMTL/weighting/MGDA.py `MGDA._find_min_norm_element`, as there; its `torch.zeros(n)` (float32) take the
    input's dtype, the same in float32."""

    def _min_norm_element_from2(v1v1, v1v2, v2v2):
        if v1v2 >= v1v1:
            gamma = 0.999
            cost = v1v1
            return gamma, cost
        if v1v2 >= v2v2:
            gamma = 0.001
            cost = v2v2
            return gamma, cost
        gamma = -1.0 * ((v1v2 - v2v2) / (v1v1 + v2v2 - 2 * v1v2))
        cost = v2v2 + gamma * (v1v2 - v2v2)
        return gamma, cost

    def _min_norm_2d(grad_mat):
        dmin = 1e8
        for i in range(grad_mat.size()[0]):
            for j in range(i + 1, grad_mat.size()[0]):
                c, d = _min_norm_element_from2(grad_mat[i, i], grad_mat[i, j], grad_mat[j, j])
                if d < dmin:
                    dmin = d
                    sol = [(i, j), c, d]
        return sol

    def _projection2simplex(y):
        m = len(y)
        sorted_y = torch.sort(y, descending=True)[0]
        tmpsum = 0.0
        tmax_f = (torch.sum(y) - 1.0) / m
        for i in range(m - 1):
            tmpsum += sorted_y[i]
            tmax = (tmpsum - 1) / (i + 1.0)
            if tmax > sorted_y[i + 1]:
                tmax_f = tmax
                break
        return torch.max(y - tmax_f, torch.zeros(m, dtype=y.dtype))

    def _next_point(cur_val, grad, n):
        proj_grad = grad - (torch.sum(grad) / n)
        tm1 = -1.0 * cur_val[proj_grad < 0] / proj_grad[proj_grad < 0]
        tm2 = (1.0 - cur_val[proj_grad > 0]) / (proj_grad[proj_grad > 0])
        t = torch.ones(1, dtype=grad.dtype)
        if (tm1 > 1e-7).sum() > 0:
            t = torch.min(tm1[tm1 > 1e-7])
        if (tm2 > 1e-7).sum() > 0:
            t = torch.min(t, torch.min(tm2[tm2 > 1e-7]))
        next_point = proj_grad * t + cur_val
        next_point = _projection2simplex(next_point)
        return next_point

    MAX_ITER = 250
    STOP_CRIT = 1e-5
    grad_mat = grads.mm(grads.t())
    init_sol = _min_norm_2d(grad_mat)
    n = grads.size()[0]
    sol_vec = torch.zeros(n, dtype=grads.dtype)
    sol_vec[init_sol[0][0]] = init_sol[1]
    sol_vec[init_sol[0][1]] = 1 - init_sol[1]
    if n < 3:
        return sol_vec
    iter_count = 0
    while iter_count < MAX_ITER:
        grad_dir = -1.0 * torch.matmul(grad_mat, sol_vec)
        new_point = _next_point(sol_vec, grad_dir, n)
        v1v1 = torch.sum(sol_vec.unsqueeze(1).repeat(1, n) * sol_vec.unsqueeze(0).repeat(n, 1) * grad_mat)
        v1v2 = torch.sum(sol_vec.unsqueeze(1).repeat(1, n) * new_point.unsqueeze(0).repeat(n, 1) * grad_mat)
        v2v2 = torch.sum(new_point.unsqueeze(1).repeat(1, n) * new_point.unsqueeze(0).repeat(n, 1) * grad_mat)
        nc, nd = _min_norm_element_from2(v1v1, v1v2, v2v2)
        new_sol_vec = nc * sol_vec + (1 - nc) * new_point
        change = new_sol_vec - sol_vec
        if torch.sum(torch.abs(change)) < STOP_CRIT:
            return sol_vec
        sol_vec = new_sol_vec
        iter_count += 1
    return sol_vec


class LibMTLMOML:
    """LibMTL main's `Trainer._prepare_tw` and `Trainer.bacth_forward_MOML` (LibMTL/trainer.py, commit
    4336804847eaa5e0b924b743d76beec7ac3fdc97), restated for one model and MSE task losses, in the model's dtype
    (their `torch.zeros(task_num, len(alpha))` is float32: the same in float32). `_gradient_normalizers` with
    ntype='l2' is one line of LibMTL/weighting/MGDA.py. Their inner, outer and training batches are arguments."""

    def __init__(self, model: nn.Module, tasks, outer_lr: float, inner_lr: float, lr: float) -> None:
        self.model, self.tasks, self.task_num, self.inner_lr = model, tasks, len(tasks), inner_lr
        dtype = next(model.parameters()).dtype
        # their TW: a FloatTensor set to 1/T (1/3 rounded to float32 also in the float64 runs, as ours)
        self.tw = nn.Parameter(torch.full((len(tasks),), 1 / len(tasks)).to(dtype))
        self.tw_optimizer = torch.optim.Adam([self.tw], lr=outer_lr)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def forward4loss(self, model, x, y):
        out = model(x)
        return torch.stack([F.mse_loss(out.preds[t], y[t]) for t in self.tasks])

    def weighted(self, losses):  # their TW.forward
        return torch.sum(torch.mul(F.softmax(self.tw, dim=-1), losses))

    def step(self, inner, outer, all_) -> None:
        inner_lr = self.inner_lr
        meta_model = copy.deepcopy(self.model)
        losses = self.forward4loss(meta_model, *inner)
        g_f = []
        for tn in range(self.task_num):
            g_f_tn = torch.autograd.grad(losses[tn], meta_model.parameters(), retain_graph=True)
            g_f.append(torch.cat([g.view(-1) for g in g_f_tn]))
        g_f = torch.stack(g_f)
        beg = 0
        alpha = self.tw.data.clone()
        for p in meta_model.parameters():
            p_grad = (F.softmax(alpha, dim=-1) @ g_f[:, beg : beg + p.numel()]).view(p.size())
            p.data -= inner_lr * p_grad
            beg += p.numel()
        g_s = torch.autograd.functional.jacobian(lambda x: F.softmax(x, dim=-1), alpha)
        losses = self.forward4loss(meta_model, *outer)
        alpha_grad = torch.zeros(self.task_num, len(alpha), dtype=alpha.dtype)
        for tn in range(self.task_num):
            g_F_tn = torch.autograd.grad(losses[tn], meta_model.parameters(), retain_graph=True)
            g_F_tn = torch.cat([g.view(-1) for g in g_F_tn])
            alpha_grad[tn] = -inner_lr * g_F_tn @ g_f.t() @ g_s
        gn = alpha_grad.pow(2).sum(-1).sqrt()  # MGDA._gradient_normalizers(..., ntype='l2')
        alpha_grad = alpha_grad / gn.unsqueeze(1).repeat(1, alpha_grad.size()[1])
        sol = find_min_norm_element(alpha_grad)
        alpha_grad = sum([sol[tn] * alpha_grad[tn] for tn in range(self.task_num)])
        self.tw_optimizer.zero_grad()
        self.tw.grad = alpha_grad
        self.tw_optimizer.step()
        loss = self.weighted(self.forward4loss(self.model, *all_))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.tw_optimizer.zero_grad()


def pair_batches(steps: int) -> list[tuple]:
    def at(rows):
        return X[rows], {t: Y[t][rows] for t in TASKS}

    return [(at(pair_rows(s)), at([(5 * s + 2 + i) % 8 for i in range(3)])) for s in range(steps)]


def three_batches(steps: int) -> list[tuple]:
    return [(batch(TASKS3, seed=10 + s), batch(TASKS3, seed=100 + s)) for s in range(steps)]


CASES = {
    "two tasks": (pair_model, TASKS, pair_batches),
    "three tasks": (lambda: make_model(TASKS3), TASKS3, three_batches),
}

# LibMTL main's own `Trainer.bacth_forward_MOML` (its source extracted from LibMTL/trainer.py at commit
# 4336804847eaa5e0b924b743d76beec7ac3fdc97, LibMTL/weighting/MGDA.py imported from the same commit, called with a
# stand-in `self`: these models in float32 as LibMTL runs them, inner_lr 0.1, SGD lr 0.1, each step's training
# batch as its inner and training batch): its task logits `tw.weights` after 6 steps, per case and outer_lr.
LIBMTL_LOGITS_AFTER_6 = {
    ("two tasks", 1e-3): [0.4957874119281769, 0.5042126178741455],
    ("three tasks", 1e-3): [0.33350738883018494, 0.32909148931503296, 0.3375627100467682],
    ("two tasks", 0.3): [-0.7637780904769897, 1.7637782096862793],
    ("three tasks", 0.3): [0.3177550137042999, -0.9677895307540894, 1.545758605003357],
}


def run_ours(case: str, outer_lr: float, dtype: torch.dtype, steps: int = 6):
    make, tasks, batches = CASES[case]
    model = make().to(dtype)
    source = model_batches(model, tasks, lr=0.1)
    bal = MOML(list(tasks), inner_lr=0.1, outer_lr=outer_lr, validation=source).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for (inputs, targets), val in cast(batches(steps), dtype):
        opt.zero_grad()
        out = model(inputs)
        source.feed((inputs, targets), val)
        bal.backward({t: F.mse_loss(out.preds[t], targets[t]) for t in tasks}, out.shared, BackwardContext())
        opt.step()
        bal.step()
    return bal, model


def run_reference(case: str, outer_lr: float, dtype: torch.dtype, steps: int = 6) -> LibMTLMOML:
    make, tasks, batches = CASES[case]
    ref = LibMTLMOML(make().to(dtype), tasks, outer_lr, inner_lr=0.1, lr=0.1)
    for inner, outer in cast(batches(steps), dtype):
        ref.step(inner, outer, inner)
    return ref


def cast(batches: list[tuple], dtype: torch.dtype) -> list[tuple]:
    return [tuple((x.to(dtype), {t: y.to(dtype) for t, y in ys.items()}) for x, ys in pair) for pair in batches]


@pytest.mark.parametrize("outer_lr", [1e-3, 0.3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_parameters_and_weights_equal_libmtl_after_six_steps(case, outer_lr):
    """Same model, initial parameters and batches (their inner and training batch: our step's batch; their outer
    batch: our validation batch). The restatement in float32 gives LibMTL's own logits; in float64 ours equals it
    up to the order of rounding, α and every parameter; ours in float32 equals LibMTL's logits to float32's
    rounding (a 1e-5 difference at outer_lr 0.3: Adam divides by √v, and a tie of two opposite α gradients
    leaves a rounding residue in place of 0)."""
    expected = torch.tensor(LIBMTL_LOGITS_AFTER_6[(case, outer_lr)])
    torch.testing.assert_close(run_reference(case, outer_lr, torch.float32).tw.detach(), expected, rtol=0, atol=0)

    ref = run_reference(case, outer_lr, torch.float64)
    bal, model = run_ours(case, outer_lr, torch.float64)
    torch.testing.assert_close(bal.weighting.logits, ref.tw.detach(), rtol=1e-9, atol=1e-12)
    n = len(CASES[case][1])
    assert not torch.allclose(bal.weighting.logits, torch.full((n,), 1 / n, dtype=torch.float64))  # the weights moved
    for (name, ours), theirs in zip(model.named_parameters(), ref.model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12, msg=name)

    bal32, _ = run_ours(case, outer_lr, torch.float32)
    torch.testing.assert_close(bal32.weighting.logits, expected, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------- the contract


def test_grad_scaler_gives_the_fp32_update():
    """Under a GradScaler the per-task gradients are taken through the scale and divided by it."""
    results = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=2.0**12)):
        model = pair_model()
        source = model_batches(model, TASKS, lr=0.1)
        bal = MOML(list(TASKS), outer_lr=0.3, validation=source)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for (inputs, targets), val in pair_batches(4):
            source.feed((inputs, targets), val)
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


def test_a_skipped_step_keeps_the_weights_and_their_adam_state():
    model = pair_model()
    (inputs, targets), val = pair_batches(1)[0]
    bal = MOML(list(TASKS), outer_lr=0.3, validation=model_batches(model, TASKS, lr=0.1).feed((inputs, targets), val))
    before = {k: v.clone() for k, v in bal.state_dict().items()}
    out = model(inputs)
    metrics = bal.backward({t: F.mse_loss(out.preds[t], targets[t]) for t in TASKS}, out.shared, BackwardContext())
    assert metrics["weight/a"].item() != 0.5  # the staged α was used for this step's weights
    bal.step(True)
    for key, value in bal.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_resumed_run_ends_like_the_uninterrupted_one(compose_cfg, tmp_path):
    args = [*SMALL, "balancer=moml", "balancer.outer_lr=0.05"]
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


def test_metrics_are_the_0_d_weights():
    model = pair_model()
    (inputs, targets), val = pair_batches(1)[0]
    bal = MOML(list(TASKS), validation=model_batches(model, TASKS, lr=0.1).feed((inputs, targets), val))
    out = model(inputs)
    metrics = bal.backward({t: F.mse_loss(out.preds[t], targets[t]) for t in TASKS}, out.shared, BackwardContext())
    bal.step(False)
    assert set(metrics) == {"weight/a", "weight/b"} and all(v.dim() == 0 for v in metrics.values())
    assert sum(v.item() for v in metrics.values()) == pytest.approx(1.0)


def test_the_smoke_command_trains_and_reports_the_weights(tmp_path):
    """`mtl-bench train balancer=moml trainer=smoke` as typed, on the default task set (10,000 rows)."""
    result = run_cli("train", "balancer=moml", "trainer=smoke", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "completed"
    assert "final loss weights: t0 " in result.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.step_mode=per_task"], "trainer.step_mode=per_task: MOML has no per-task mode"),
        (["trainer.grad_accumulation_steps=2"], "trainer.grad_accumulation_steps=2: MOML takes one"),
        (["balancer.inner_lr=0"], "balancer.inner_lr: must be a number > 0, got 0"),
        (["balancer.outer_lr=-1"], "balancer.outer_lr: must be a number > 0, got -1"),
        (["+balancer.inner_step=2"], "balancer.inner_step"),
    ],
)
def test_meaningless_settings_stop_in_one_line_before_training(compose_cfg, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        train(compose_cfg(*SMALL, "balancer=moml", *overrides), tmp_path)
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_several_processes_and_a_missing_validation_source_are_refused():
    with pytest.raises(ValueError, match="^world_size: MOML runs in one process"):
        MOML(list(TASKS), world_size=2)
    with pytest.raises(ValueError, match="^validation: MOML learns on validation batches; pass an object"):
        MOML(list(TASKS))
    with pytest.raises(ValueError, match="^validation: MOML needs a mtl_bench.balancers.ValidationSource; list has no"):
        MOML(list(TASKS), validation=[X, Y])  # the data itself where the source is expected
