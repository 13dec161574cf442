"""UncertaintyWeighting: the update by hand, exactness against LibMTL 1.1.5's UW, resume, AMP skips, per-task mode."""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import math
import sys
import types
from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mtl_bench.balancers import BackwardContext, UncertaintyWeighting
from mtl_bench.models.base import MultiTaskModel
from processes import spawn_and_wait

TASKS = ("a", "b")
X = torch.tensor([[0.5, -1.0, 0.3], [1.2, 0.4, -0.7], [-0.6, 0.9, 1.1], [0.2, -0.3, -1.4],
                  [-1.3, 0.8, 0.1], [0.7, 1.5, -0.2], [-0.4, -1.1, 0.6], [1.0, 0.2, 0.9]])
Y = {"a": torch.tensor([[0.4], [-1.0], [0.8], [0.3], [-0.5], [1.2], [-0.9], [0.6]]),
     "b": torch.tensor([[2.0, -1.5], [0.5, 3.0], [-2.5, 1.0], [1.5, 0.5], [-1.0, -2.0], [3.0, 0.2], [0.1, -3.0],
                        [-0.8, 2.2]])}
PARAMS = {
    "trunk.0.weight": [[0.3, -0.2, 0.5], [-0.4, 0.1, 0.25], [0.15, 0.35, -0.3], [-0.1, -0.45, 0.2]],
    "trunk.0.bias": [0.05, -0.1, 0.2, 0.0],
    "heads.a.weight": [[0.4, -0.3, 0.2, 0.5]], "heads.a.bias": [0.1],
    "heads.b.weight": [[-0.2, 0.35, 0.45, -0.15], [0.3, 0.1, -0.4, 0.25]], "heads.b.bias": [-0.05, 0.15],
}


def make_model() -> MultiTaskModel:
    trunk = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    model = MultiTaskModel(trunk, {"a": nn.Linear(4, 1), "b": nn.Linear(4, 2)}, last_shared_layer=trunk[0])
    model.load_state_dict({k: torch.tensor(v) for k, v in PARAMS.items()})
    return model


def rows(step: int) -> list[int]:
    return [(3 * step + i) % 8 for i in range(4)]


def model_losses(model: MultiTaskModel, step: int):
    idx = rows(step)
    out = model(X[idx])
    return out, {t: F.mse_loss(out.preds[t], Y[t][idx]) for t in TASKS}


def train(model, bal, steps: range, scaler=None, lr: float = 0.05) -> dict[str, torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    metrics: dict[str, torch.Tensor] = {}
    for step in steps:
        opt.zero_grad()
        out, losses = model_losses(model, step)
        metrics = bal.backward(losses, out.shared, scaler)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        metrics |= bal.step()
    return metrics


def libmtl_weighting(name: str) -> types.ModuleType:
    """A module of LibMTL's `weighting` package, loaded from the installed files without running
    `LibMTL/__init__.py` (it imports `torchvision.models.utils`, which torchvision no longer has, so
    `pytest.importorskip("LibMTL")` would always skip)."""
    spec = importlib.util.find_spec("LibMTL")
    if spec is None or spec.origin is None:
        pytest.skip("LibMTL (the peers extra) is not installed")
    root = Path(spec.origin).parent
    names = ("LibMTL", "LibMTL.weighting", "LibMTL.weighting.abstract_weighting", f"LibMTL.weighting.{name}")
    saved = {key: sys.modules.pop(key, None) for key in names}
    try:
        for package, path in (("LibMTL", root), ("LibMTL.weighting", root / "weighting")):
            stub = types.ModuleType(package)
            stub.__path__ = [str(path)]
            sys.modules[package] = stub
        return importlib.import_module(f"LibMTL.weighting.{name}")
    finally:
        for key, module in saved.items():
            sys.modules.pop(key, None)
            if module is not None:
                sys.modules[key] = module


@contextlib.contextmanager
def no_host_sync(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def boom(*args, **kwargs):
        raise AssertionError("host sync in the hot path")
    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
            m.setattr(torch.Tensor, name, boom)
        yield


# ---------------------------------------------------------------------------------------------- the formula

def test_one_update_by_hand():
    shared = torch.zeros(1, requires_grad=True)
    losses = {"a": (2.0 + shared).sum(), "b": (0.5 + 3 * shared).sum()}  # L = (2, 0.5), dL/dshared = (1, 3)
    bal = UncertaintyWeighting(list(TASKS), init_log_var=0.0, lr=0.1, optimizer="sgd")
    metrics = bal.backward(losses, shared)
    # w = 1/(2e^0) = 0.5 each: shared.grad = 0.5·1 + 0.5·3. ∂/∂s = 1/2 − L/(2e^s) = (−0.5, 0.25).
    assert shared.grad.item() == pytest.approx(2.0)
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == [0.5, 0.5]
    assert [metrics[f"uw/log_var/{t}"].item() for t in TASKS] == [0.0, 0.0]
    assert bal.log_vars.tolist() == pytest.approx([0.05, -0.025])
    assert bal.weights.tolist() == pytest.approx([0.5 * math.exp(-0.05), 0.5 * math.exp(0.025)])


def test_update_equals_autograd_of_the_objective():
    """The closed-form gradient against autograd of LibMTL's Σ L/(2e^s) + s/2, with Adam and weight decay."""
    s = torch.tensor([-0.5, 0.3], requires_grad=True)
    opt = torch.optim.Adam([s], lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    bal = UncertaintyWeighting(list(TASKS), lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    bal.log_vars.copy_(s.detach())
    for values in ((2.0, 0.5), (1.5, 0.7), (1.0, 0.2)):
        L = torch.tensor(values)
        opt.zero_grad()
        (L / (2 * s.exp()) + s / 2).sum().backward()
        opt.step()
        shared = torch.zeros(1, requires_grad=True)
        bal.backward({t: (v + shared).sum() for t, v in zip(TASKS, values)}, shared)
        torch.testing.assert_close(bal.log_vars, s.detach(), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------- the reference

@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_matches_libmtl_uw(optimizer: str):
    """LibMTL's UW holds the log-variances as parameters of the model, stepped by the model's optimizer;
    ours steps them itself with the same optimizer settings: the same parameters after 6 steps."""
    module = libmtl_weighting("UW")
    ref_model, ref = make_model(), module.UW()
    ref.task_num, ref.device = len(TASKS), "cpu"
    ref.init_param()
    make = (lambda p: torch.optim.Adam(p, lr=0.05)) if optimizer == "adam" else (lambda p: torch.optim.SGD(p, lr=0.05))
    ref_opt = make([*ref_model.parameters(), ref.loss_scale])
    model = make_model()
    opt = make(model.parameters())
    bal = UncertaintyWeighting(list(TASKS), lr=0.05, optimizer=optimizer)
    for step in range(6):
        ref_opt.zero_grad()
        _, losses = model_losses(ref_model, step)
        ref.backward(torch.stack([losses[t] for t in TASKS]))
        ref_opt.step()
        opt.zero_grad()
        out, losses = model_losses(model, step)
        bal.backward(losses, out.shared, BackwardContext())
        opt.step()
        bal.step()
    torch.testing.assert_close(bal.log_vars, ref.loss_scale.detach(), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(bal.log_vars, torch.full((2,), -0.5), atol=1e-2)  # the state matters
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------- the contract

def test_state_dict_round_trip_continues_identically():
    model, bal = make_model(), UncertaintyWeighting(list(TASKS), lr=0.05)
    train(model, bal, range(3))
    saved_model, saved_bal = copy.deepcopy(model.state_dict()), copy.deepcopy(bal.state_dict())
    assert {"log_vars", "exp_avg", "exp_avg_sq", "opt_step"} <= set(saved_bal)
    straight = train(model, bal, range(3, 6))

    resumed_model, resumed = make_model(), UncertaintyWeighting(list(TASKS), lr=0.05)
    resumed_model.load_state_dict(saved_model)
    resumed.load_state_dict(saved_bal)
    again = train(resumed_model, resumed, range(3, 6))
    for key in straight:
        assert torch.equal(again[key], straight[key]), key
    for key, value in bal.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_grad_scaler_gives_the_fp32_update_and_a_skipped_step_changes_nothing():
    model, reference = make_model(), UncertaintyWeighting(list(TASKS), lr=0.05)
    expected = train(model, reference, range(3))
    model, bal = make_model(), UncertaintyWeighting(list(TASKS), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    got = train(model, bal, range(3), scaler)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-7)

    before = copy.deepcopy(bal.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out, losses = model_losses(model, 7)
    bal.backward(losses, out.shared, scaler)
    model.heads["a"].bias.grad.fill_(float("inf"))  # the scaler skips this step
    scaler.step(opt)
    scaler.update()
    bal.step()
    for key, value in bal.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_per_task_mode_and_accumulation_give_the_joint_update():
    model, joint = make_model(), UncertaintyWeighting(list(TASKS), lr=0.05)
    out, losses = model_losses(model, 0)
    expected = joint.backward(losses, out.shared)
    expected_grads = [p.grad.clone() for p in model.parameters()]

    model, bal = make_model(), UncertaintyWeighting(list(TASKS), lr=0.05)
    metrics: dict[str, torch.Tensor] = {}
    for task in ("b", "a"):
        out, losses = model_losses(model, 0)
        metrics |= bal.backward_task(task, losses[task], out.shared, BackwardContext())
    assert torch.equal(bal.log_vars, torch.full((2,), -0.5))  # staged until step()
    metrics |= bal.step()
    assert metrics.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(metrics[key], expected[key])
    torch.testing.assert_close(bal.log_vars, joint.log_vars)
    for g, ref in zip((p.grad for p in model.parameters()), expected_grads):
        torch.testing.assert_close(g, ref)

    # Two micro-batches of half the batch: the update from the mean loss, as one batch of the mean.
    bal = UncertaintyWeighting(list(TASKS), lr=0.05)
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    halves = ({"a": torch.tensor(2.0), "b": torch.tensor(0.25)}, {"a": torch.tensor(1.0), "b": torch.tensor(0.75)})
    for half in halves:
        shared = torch.zeros(1, requires_grad=True)
        bal.backward({t: v + shared.sum() for t, v in half.items()}, shared, ctx)
    bal.step()
    one = UncertaintyWeighting(list(TASKS), lr=0.05)
    shared = torch.zeros(1, requires_grad=True)
    one.backward({"a": torch.tensor(1.5) + shared.sum(), "b": torch.tensor(0.5) + shared.sum()}, shared)
    torch.testing.assert_close(bal.log_vars, one.log_vars)


def test_metrics_and_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    model, bal = make_model(), UncertaintyWeighting(list(TASKS))
    scaler = torch.amp.GradScaler("cpu")
    out, losses = model_losses(model, 0)
    with no_host_sync(monkeypatch):
        metrics = bal.backward(losses, out.shared, scaler)
        bal.step()
        for task in TASKS:
            out, losses = model_losses(model, 1)
            bal.backward_task(task, losses[task], out.shared, scaler)
        bal.step()
    assert set(metrics) == {f"{family}/{t}" for family in ("weight", "uw/log_var") for t in TASKS}
    assert all(v.dim() == 0 for v in metrics.values())


def DDP_BALANCER(names: list[str], model: MultiTaskModel):  # noqa: N802 (read by the spawned workers)
    return UncertaintyWeighting(names, lr=0.05)


DDP_STEPS = 4


# ---------------------------------------------------------------------------------------------- DDP

def ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """Each rank trains on its half of every batch, its tasks listed in its own order."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = make_model()
        ddp = DistributedDataParallel(model)
        bal = DDP_BALANCER(list(TASKS) if rank == 0 else list(reversed(TASKS)), model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for step in range(DDP_STEPS):
            idx = rows(step)[2 * rank:2 * rank + 2]
            opt.zero_grad()
            out = ddp(X[idx])
            bal.backward({t: F.mse_loss(out.preds[t], Y[t][idx]) for t in TASKS}, out.shared, BackwardContext())
            opt.step()
            bal.step()
        torch.save({"state": bal.state_dict(), "params": [p.detach() for p in model.parameters()]},
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ddp(tmp_path: Path) -> tuple[dict, dict]:
    spawn_and_wait(ddp_worker, (2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, timeout_s=120,
                   what="DDP workers did not finish (a collective mismatch hangs)")
    return tuple(torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))  # type: ignore[return-value]


@pytest.mark.slow  # two spawned processes: about 25 s on 2 shared cores
def test_ddp_ranks_hold_the_state_of_one_process_on_the_whole_batch(tmp_path: Path):
    """Two gloo ranks, each on half of every batch (tasks listed in different orders), hold the same state, and
    it is the state of one process on the whole batch (the losses are averaged across ranks by name)."""
    r0, r1 = run_ddp(tmp_path)
    model = make_model()
    bal = DDP_BALANCER(list(TASKS), model)
    train(model, bal, range(DDP_STEPS))
    for key, value in bal.state_dict().items():
        if key == "_extra_state":
            assert torch.equal(r0["state"][key]["generator"], r1["state"][key]["generator"])
            assert torch.equal(r0["state"][key]["generator"], value["generator"])
            continue
        assert torch.equal(r0["state"][key], r1["state"][key]), key
        torch.testing.assert_close(r0["state"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    for p0, p1, p in zip(r0["params"], r1["params"], model.parameters()):
        assert torch.equal(p0, p1)
        torch.testing.assert_close(p0, p.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("options", "message"), [
    ({"lr": -1}, "lr: must be > 0, got -1"),
    ({"optimizer": "lbfgs"}, "optimizer: 'lbfgs' is not one of adam, sgd"),
    ({"weight_decay": -0.1}, "weight_decay: must be >= 0"),
    ({"betas": (0.9, 1.0)}, "betas: must be two numbers in [0, 1)"),
    ({"eps": 0.0}, "eps: must be > 0"),
    ({"init_log_var": float("nan")}, "init_log_var: must be finite"),
])
def test_bad_options_name_their_argument(options, message):
    with pytest.raises(ValueError) as info:
        UncertaintyWeighting(list(TASKS), **options)
    assert str(info.value).startswith(message)
