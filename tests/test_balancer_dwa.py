"""DynamicWeightAverage: the weights by hand, exactness against LibMTL 1.1.5's DWA, resume, AMP skips, per-task mode."""

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

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mtl_bench.balancers import BackwardContext, DynamicWeightAverage
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

def constant_losses(a: float, b: float, items: int = 1):
    shared = torch.zeros(items, requires_grad=True)
    return {"a": a + shared.sum(), "b": b + shared.sum()}, shared


def test_weights_by_hand():
    bal = DynamicWeightAverage(list(TASKS), temperature=2.0, period=2)
    # Period 0: a = (4, 2), b = (1, 1) -> means (3, 1); period 1: a = (1.5, 1.5), b = (2, 0) -> (1.5, 1).
    for a, b in ((4.0, 1.0), (2.0, 1.0), (1.5, 2.0), (1.5, 0.0)):
        losses, shared = constant_losses(a, b)
        metrics = bal.backward(losses, shared)
        assert [metrics[f"weight/{t}"].item() for t in TASKS] == [1.0, 1.0]  # fewer than two complete periods
    assert bal.periods.item() == 2 and bal.last.tolist() == [1.5, 1.0] and bal.before_last.tolist() == [3.0, 1.0]
    losses, shared = constant_losses(1.0, 1.0)
    metrics = bal.backward(losses, shared)
    r = [0.5, 1.0]  # rates L̄(1)/L̄(0)
    e = [math.exp(x / 2.0) for x in r]
    expected = [2 * v / sum(e) for v in e]
    assert [metrics[f"weight/{t}"].item() for t in TASKS] == pytest.approx(expected)
    assert [metrics[f"dwa/rate/{t}"].item() for t in TASKS] == pytest.approx(r)
    torch.testing.assert_close(shared.grad, torch.tensor([sum(expected)]))


def test_period_averages_weight_steps_by_batch_size():
    bal = DynamicWeightAverage(list(TASKS), period=2)
    for a, items in ((1.0, 3), (5.0, 1)):
        losses, shared = constant_losses(a, 1.0, items)
        bal.backward(losses, shared)
    assert bal.last.tolist() == [pytest.approx((3 * 1.0 + 1 * 5.0) / 4), 1.0]


# ---------------------------------------------------------------------------------------------- the reference

BATCHES = (3, 3, 2)  # one epoch: 8 items in batches of 3, 3, 2 (LibMTL weights epoch means by batch size)


def epoch_rows(epoch: int, batch: int) -> list[int]:
    start = sum(BATCHES[:batch])
    return [(5 * epoch + start + j) % 8 for j in range(BATCHES[batch])]


def test_matches_libmtl_dwa_with_period_equal_to_an_epoch():
    module = libmtl_weighting("DWA")
    epochs = 5
    ref_model, ref = make_model(), module.DWA()
    ref.task_num, ref.device, ref.train_loss_buffer = len(TASKS), "cpu", np.zeros([len(TASKS), epochs])
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    model, bal = make_model(), DynamicWeightAverage(list(TASKS), temperature=2.0, period=len(BATCHES))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = []
    for epoch in range(epochs):
        ref.epoch = epoch
        record: dict[str, list[tuple[float, int]]] = {t: [] for t in TASKS}
        for batch in range(len(BATCHES)):
            idx = epoch_rows(epoch, batch)
            out = ref_model(X[idx])
            losses = [F.mse_loss(out.preds[t], Y[t][idx]) for t in TASKS]
            for t, loss in zip(TASKS, losses):
                record[t].append((loss.item(), len(idx)))  # LibMTL's AbsLoss._update_loss
            ref_opt.zero_grad()
            ref_weights = ref.backward(torch.stack(losses), T=2.0)
            ref_opt.step()

            opt.zero_grad()
            out = model(X[idx])
            metrics = bal.backward({t: F.mse_loss(out.preds[t], Y[t][idx]) for t in TASKS}, out.shared,
                                   BackwardContext())
            opt.step()
            bal.step()
            weights.append([metrics[f"weight/{t}"].item() for t in TASKS])
            np.testing.assert_allclose(weights[-1], ref_weights, rtol=1e-5)
        for i, t in enumerate(TASKS):  # LibMTL's AbsLoss._average_loss
            values, sizes = np.array([v for v, _ in record[t]]), np.array([n for _, n in record[t]])
            ref.train_loss_buffer[i, epoch] = (values * sizes).sum() / sizes.sum()
    assert len({tuple(w) for w in weights}) > 3  # the weights moved in the last epochs
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------- the contract

def test_state_dict_round_trip_continues_identically():
    model, bal = make_model(), DynamicWeightAverage(list(TASKS), period=2)
    train(model, bal, range(5))
    saved_model, saved_bal = copy.deepcopy(model.state_dict()), copy.deepcopy(bal.state_dict())
    assert {"period_sum", "period_items", "period_steps", "periods", "last", "before_last"} <= set(saved_bal)
    straight = train(model, bal, range(5, 10))

    resumed_model, resumed = make_model(), DynamicWeightAverage(list(TASKS), period=2)
    resumed_model.load_state_dict(saved_model)
    resumed.load_state_dict(saved_bal)
    again = train(resumed_model, resumed, range(5, 10))
    assert straight["weight/a"].item() != 1.0
    for key in straight:
        assert torch.equal(again[key], straight[key]), key
    for key, value in bal.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_grad_scaler_gives_the_fp32_weights_and_a_skipped_step_changes_nothing():
    model, reference = make_model(), DynamicWeightAverage(list(TASKS), period=2)
    expected = train(model, reference, range(6))
    model, bal = make_model(), DynamicWeightAverage(list(TASKS), period=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    got = train(model, bal, range(6), scaler)
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
    model, joint = make_model(), DynamicWeightAverage(list(TASKS), period=1)
    per_task_model, bal = make_model(), DynamicWeightAverage(list(TASKS), period=1)
    for step in range(4):
        out, losses = model_losses(model, step)
        expected = joint.backward(losses, out.shared)
        metrics: dict[str, torch.Tensor] = {}
        for task in ("b", "a"):
            out, losses = model_losses(per_task_model, step)
            metrics |= bal.backward_task(task, losses[task], out.shared, BackwardContext())
        metrics |= bal.step()
        assert metrics.keys() == expected.keys()
        for key in expected:
            torch.testing.assert_close(metrics[key], expected[key])
    for name in ("last", "before_last", "periods"):
        assert torch.equal(getattr(bal, name), getattr(joint, name)), name
    for g, ref in zip((p.grad for p in per_task_model.parameters()), (p.grad for p in model.parameters())):
        torch.testing.assert_close(g, ref)

    # Two micro-batches per step: the step's loss is their mean.
    bal, one = DynamicWeightAverage(list(TASKS), period=1), DynamicWeightAverage(list(TASKS), period=1)
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    for step_losses in (((2.0, 1.0), (4.0, 3.0)), ((1.0, 1.0), (2.0, 2.0))):
        for a, b in step_losses:
            losses, shared = constant_losses(a, b)
            bal.backward(losses, shared, ctx)
        bal.step()
        mean = [sum(v) / 2 for v in zip(*step_losses)]
        losses, shared = constant_losses(*mean)
        one.backward(losses, shared)
    torch.testing.assert_close(bal.last, one.last)
    torch.testing.assert_close(bal.before_last, one.before_last)


def test_metrics_and_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    model, bal = make_model(), DynamicWeightAverage(list(TASKS), period=1)
    scaler = torch.amp.GradScaler("cpu")
    out, losses = model_losses(model, 0)
    with no_host_sync(monkeypatch):
        metrics = bal.backward(losses, out.shared, scaler)
        bal.step()
        for task in TASKS:
            out, losses = model_losses(model, 1)
            bal.backward_task(task, losses[task], out.shared, scaler)
        bal.step()
    assert set(metrics) == {f"{family}/{t}" for family in ("weight", "dwa/rate") for t in TASKS}
    assert all(v.dim() == 0 for v in metrics.values())


def DDP_BALANCER(names: list[str], model: MultiTaskModel):  # noqa: N802 (read by the spawned workers)
    return DynamicWeightAverage(names, period=2)


DDP_STEPS = 6


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
    ({"temperature": 0.0}, "temperature: must be > 0, got 0.0"),
    ({"period": 0}, "period: must be an integer >= 1, got 0"),
    ({"period": 2.5}, "period: must be an integer >= 1"),
])
def test_bad_options_name_their_argument(options, message):
    with pytest.raises(ValueError) as info:
        DynamicWeightAverage(list(TASKS), **options)
    assert str(info.value).startswith(message)
