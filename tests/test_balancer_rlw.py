"""RandomLossWeighting: softmax of draws from its own generator, exactness against LibMTL 1.1.5's RLW, resume, skips."""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
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

from mtl_bench.balancers import BackwardContext, RandomLossWeighting
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
    module = libmtl_weighting("RLW")
    ref_model, ref = make_model(), module.RLW()
    ref.task_num, ref.device = len(TASKS), "cpu"
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    torch.manual_seed(11)
    ref_weights = []
    for step in range(6):
        ref_opt.zero_grad()
        _, losses = model_losses(ref_model, step)
        ref_weights.append(ref.backward(torch.stack([losses[t] for t in TASKS]), dist=distribution.capitalize()))
        ref_opt.step()

    model, bal = make_model(), RandomLossWeighting(list(TASKS), seed=11, distribution=distribution)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        opt.zero_grad()
        out, losses = model_losses(model, step)
        metrics = bal.backward(losses, out.shared, BackwardContext())
        opt.step()
        bal.step()
        assert [metrics[f"weight/{t}"].item() for t in TASKS] == pytest.approx(ref_weights[step].tolist(), rel=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------- the contract

def test_state_dict_round_trip_continues_identically():
    model, bal = make_model(), RandomLossWeighting(list(TASKS), seed=5)
    train(model, bal, range(3))
    saved_model, saved_bal = copy.deepcopy(model.state_dict()), copy.deepcopy(bal.state_dict())
    assert {"weights", "_extra_state"} <= set(saved_bal)
    straight = [train(model, bal, range(s, s + 1)) for s in range(3, 6)]

    resumed_model, resumed = make_model(), RandomLossWeighting(list(TASKS), seed=99)  # the seed comes from the state
    resumed_model.load_state_dict(saved_model)
    resumed.load_state_dict(saved_bal)
    again = [train(resumed_model, resumed, range(s, s + 1)) for s in range(3, 6)]
    for one, other in zip(straight, again):
        for key in one:
            assert torch.equal(one[key], other[key]), key
    assert torch.equal(resumed.weights, bal.weights)


def test_a_skipped_step_keeps_the_weights_for_its_retry():
    model, bal = make_model(), RandomLossWeighting(list(TASKS), seed=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = bal.weights.clone()
    out, losses = model_losses(model, 0)
    first = bal.backward(losses, out.shared, scaler)
    model.heads["a"].bias.grad.fill_(float("inf"))  # the scaler skips this step
    scaler.step(opt)
    scaler.update()
    bal.step()
    assert torch.equal(bal.weights, before)
    opt.zero_grad()
    out, losses = model_losses(model, 0)
    retry = bal.backward(losses, out.shared, scaler)
    scaler.step(opt)
    scaler.update()
    bal.step()
    assert all(torch.equal(first[k], retry[k]) for k in first)
    assert not torch.equal(bal.weights, before)


def test_per_task_mode_and_accumulation_use_one_draw_per_step():
    joint_model, joint = make_model(), RandomLossWeighting(list(TASKS), seed=4)
    model, bal = make_model(), RandomLossWeighting(list(TASKS), seed=4)
    for step in range(3):
        joint_model.zero_grad()
        model.zero_grad()
        out, losses = model_losses(joint_model, step)
        expected = joint.backward(losses, out.shared)
        metrics: dict[str, torch.Tensor] = {}
        ctx = BackwardContext(factor=0.5, accumulation_steps=2)
        for _ in range(2):  # two micro-batches, each task on its own
            for task in ("b", "a"):
                out, losses = model_losses(model, step)
                metrics |= bal.backward_task(task, losses[task], out.shared, ctx)
        bal.step()
        for key in expected:
            assert torch.equal(metrics[key], expected[key]), key
        for g, ref in zip((p.grad for p in model.parameters()), (p.grad for p in joint_model.parameters())):
            torch.testing.assert_close(g, ref)


def test_metrics_and_no_host_sync(monkeypatch: pytest.MonkeyPatch):
    model, bal = make_model(), RandomLossWeighting(list(TASKS))
    scaler = torch.amp.GradScaler("cpu")
    out, losses = model_losses(model, 0)
    with no_host_sync(monkeypatch):
        metrics = bal.backward(losses, out.shared, scaler)
        bal.step()
        for task in TASKS:
            out, losses = model_losses(model, 1)
            bal.backward_task(task, losses[task], out.shared, scaler)
        bal.step()
    assert set(metrics) == {f"weight/{t}" for t in TASKS}
    assert all(v.dim() == 0 for v in metrics.values())


def DDP_BALANCER(names: list[str], model: MultiTaskModel):  # noqa: N802 (read by the spawned workers)
    return RandomLossWeighting(names, seed=3)


DDP_STEPS = 3


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
    ({"seed": 1.5}, "seed: must be an integer, got 1.5"),
    ({"distribution": "cauchy"}, "distribution: 'cauchy' is not one of normal, uniform, dirichlet, bernoulli"),
])
def test_bad_options_name_their_argument(options, message):
    with pytest.raises(ValueError) as info:
        RandomLossWeighting(list(TASKS), **options)
    assert str(info.value).startswith(message)
