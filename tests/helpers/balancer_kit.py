"""Scaffolding the balancer tests share (imported as `balancer_kit`, like `processes`):

- the host-sync guard and the SGD loop every stateful balancer test trains with;
- the fixed two-task case of the loss-weighting methods (UW, DWA, RLW, FAMO, DB-MTL): data, a model with fixed
  initial parameters, the resume / GradScaler / skipped-step / no-host-sync checks and the 2-process DDP run;
- the seeded three-task case of the gradient methods (mtl_bench.gradient_engine.gradient_balancer) and GradNorm: a tiny
  hard-parameter-sharing model, SGD runs of our balancers, and the reference implementations (LibMTL 1.1.5's
  weighting modules loaded from the installed files by `benchmarks.peers`, torchjd 0.18) on the same
  model, data and initial parameters.
"""

from __future__ import annotations

import contextlib
import copy
import types
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from benchmarks import peers
from mtl_bench.balancers import BackwardContext
from mtl_bench.models.base import MultiTaskModel
from tests.helpers.host_sync import no_host_sync  # noqa: F401  (the balancer tests import it from here)
from tests.helpers.processes import spawn_and_wait

Metrics = dict[str, torch.Tensor]


def sgd_train(model: nn.Module, bal, steps: range, losses_at: Callable, scaler=None, lr: float = 0.05) -> Metrics:
    """SGD over `steps`, the losses of each step from `losses_at(model, step) -> (out, losses)`: the last
    step's metrics (the backward's and the step's)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    metrics: Metrics = {}
    for step in steps:
        opt.zero_grad()
        out, losses = losses_at(model, step)
        metrics = bal.backward(losses, out.shared, scaler)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        metrics |= bal.step()
    return metrics


def assert_state_is(bal: nn.Module, state: dict) -> None:
    """`bal`'s state_dict equals `state` (a generator's state in `_extra_state` included)."""
    for key, value in state.items():
        if key.endswith("_extra_state"):
            assert torch.equal(bal.state_dict()[key]["generator"], value["generator"])
        else:
            assert torch.equal(bal.state_dict()[key], value), key


# ---------------------------------------------------------------------------------------------- two tasks, fixed

TASKS = ("a", "b")
X = torch.tensor(
    [
        [0.5, -1.0, 0.3],
        [1.2, 0.4, -0.7],
        [-0.6, 0.9, 1.1],
        [0.2, -0.3, -1.4],
        [-1.3, 0.8, 0.1],
        [0.7, 1.5, -0.2],
        [-0.4, -1.1, 0.6],
        [1.0, 0.2, 0.9],
    ]
)
Y = {
    "a": torch.tensor([[0.4], [-1.0], [0.8], [0.3], [-0.5], [1.2], [-0.9], [0.6]]),
    "b": torch.tensor(
        [[2.0, -1.5], [0.5, 3.0], [-2.5, 1.0], [1.5, 0.5], [-1.0, -2.0], [3.0, 0.2], [0.1, -3.0], [-0.8, 2.2]]
    ),
}
PARAMS = {
    "trunk.0.weight": [[0.3, -0.2, 0.5], [-0.4, 0.1, 0.25], [0.15, 0.35, -0.3], [-0.1, -0.45, 0.2]],
    "trunk.0.bias": [0.05, -0.1, 0.2, 0.0],
    "heads.a.weight": [[0.4, -0.3, 0.2, 0.5]],
    "heads.a.bias": [0.1],
    "heads.b.weight": [[-0.2, 0.35, 0.45, -0.15], [0.3, 0.1, -0.4, 0.25]],
    "heads.b.bias": [-0.05, 0.15],
}


def pair_model() -> MultiTaskModel:
    trunk = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    model = MultiTaskModel(trunk, {"a": nn.Linear(4, 1), "b": nn.Linear(4, 2)}, last_shared_layer=trunk[0])
    model.load_state_dict({k: torch.tensor(v) for k, v in PARAMS.items()})
    return model


def pair_rows(step: int) -> list[int]:
    return [(3 * step + i) % 8 for i in range(4)]


def pair_losses(model: MultiTaskModel, step: int):
    idx = pair_rows(step)
    out = model(X[idx])
    return out, {t: F.mse_loss(out.preds[t], Y[t][idx]) for t in TASKS}


def train(model, bal, steps: range, scaler=None, lr: float = 0.05) -> Metrics:
    return sgd_train(model, bal, steps, pair_losses, scaler, lr)


def constant_losses(a: float, b: float, items: int = 1):
    """L = (a, b) on a zero `shared` of `items` elements (each loss's gradient there is 1 per element)."""
    shared = torch.zeros(items, requires_grad=True)
    return {"a": a + shared.sum(), "b": b + shared.sum()}, shared


def assert_resume_continues(
    make: Callable[[MultiTaskModel], nn.Module],
    first: range,
    then: range,
    remake: Callable[[MultiTaskModel], nn.Module] | None = None,
) -> tuple[dict, list]:
    """Train `first`, save model and balancer, train `then`; a fresh pair (balancer from `remake`, by default
    `make`) loaded from the save trains `then` to the same metrics (every step's), state and parameters.
    The saved balancer state and the metrics of each step of `then`."""
    model = pair_model()
    bal = make(model)
    train(model, bal, first)
    saved_model, saved_bal = copy.deepcopy(model.state_dict()), copy.deepcopy(bal.state_dict())
    straight = [train(model, bal, range(s, s + 1)) for s in then]

    resumed_model = pair_model()
    resumed_model.load_state_dict(saved_model)
    resumed = (remake or make)(resumed_model)
    resumed.load_state_dict(saved_bal)
    again = [train(resumed_model, resumed, range(s, s + 1)) for s in then]
    for one, other in zip(straight, again):
        assert one.keys() == other.keys()
        for key in one:
            assert torch.equal(other[key], one[key]), key
    assert_state_is(resumed, bal.state_dict())
    for p, q in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(p, q)
    return saved_bal, straight


def assert_scaler_is_fp32_and_a_skip_changes_nothing(make: Callable[[MultiTaskModel], nn.Module], steps: range) -> None:
    """Trained with a GradScaler the metrics and parameters are fp32's; then a step the scaler skips (an
    infinite gradient) leaves the balancer's state as it was."""
    model = pair_model()
    expected = train(model, make(model), steps)
    expected_params = [p.detach().clone() for p in model.parameters()]
    model = pair_model()
    bal = make(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    got = train(model, bal, steps, scaler)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-7)
    for p, q in zip(model.parameters(), expected_params):
        torch.testing.assert_close(p.detach(), q, rtol=1e-5, atol=1e-7)

    before = copy.deepcopy(bal.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt.zero_grad()
    out, losses = pair_losses(model, 7)
    bal.backward(losses, out.shared, scaler)
    model.heads["a"].bias.grad.fill_(float("inf"))  # the scaler skips this step
    scaler.step(opt)
    scaler.update()
    bal.step()
    assert_state_is(bal, before)


def metrics_without_host_sync(bal, monkeypatch: pytest.MonkeyPatch, per_task: bool = True) -> Metrics:
    """A joint step (and a per-task one) under a GradScaler with host syncs forbidden: the joint metrics,
    checked to be 0-d."""
    model, scaler = pair_model(), torch.amp.GradScaler("cpu")
    with no_host_sync(monkeypatch):
        out, losses = pair_losses(model, 0)
        metrics = bal.backward(losses, out.shared, scaler)
        bal.step()
        if per_task:
            for task in TASKS:
                out, losses = pair_losses(model, 1)
                bal.backward_task(task, losses[task], out.shared, scaler)
        else:
            out, losses = pair_losses(model, 1)
            metrics = bal.backward(losses, out.shared, scaler)
        bal.step()
    assert all(v.dim() == 0 for v in metrics.values())
    return metrics


def ddp_worker(rank: int, world: int, init_file: str, out_dir: str, make: Callable, steps: int, micro: int = 1) -> None:
    """Each rank trains on its half of every batch, its tasks listed in its own order; `make(names, model)`
    builds the balancer (a module-level function of the test, so the spawned process can unpickle it). `micro`
    batches a step are accumulated as the engine does: every backward but the last under `no_sync`."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = pair_model()
        ddp = DistributedDataParallel(model)
        bal = make(list(TASKS) if rank == 0 else list(reversed(TASKS)), model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        ctx = BackwardContext(factor=1 / micro, accumulation_steps=micro) if micro > 1 else BackwardContext()
        for step in range(steps):
            opt.zero_grad()
            for j in range(micro):
                idx = pair_rows(step * micro + j)[2 * rank : 2 * rank + 2]
                with ddp.no_sync() if j < micro - 1 else contextlib.nullcontext():
                    out = ddp(X[idx])
                    bal.backward({t: F.mse_loss(out.preds[t], Y[t][idx]) for t in TASKS}, out.shared, ctx)
            opt.step()
            bal.step()
        torch.save(
            {"state": bal.state_dict(), "params": [p.detach() for p in model.parameters()]},
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def run_ddp(tmp_path: Path, make: Callable, steps: int, micro: int = 1) -> tuple[dict, dict]:
    """Two gloo ranks (`ddp_worker`): what each saved, after checking that both hold the same state and parameters."""
    spawn_and_wait(
        ddp_worker,
        (2, str(tmp_path / "init"), str(tmp_path), make, steps, micro),
        nprocs=2,
        timeout_s=120,
        what="DDP workers did not finish (a collective mismatch hangs)",
    )
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    for key in r0["state"]:
        if key.endswith("_extra_state"):
            assert torch.equal(r0["state"][key]["generator"], r1["state"][key]["generator"])
        else:
            assert torch.equal(r0["state"][key], r1["state"][key]), key
    for p0, p1 in zip(r0["params"], r1["params"]):
        assert torch.equal(p0, p1)
    return r0, r1


def assert_ddp_is_one_process_on_the_whole_batch(tmp_path: Path, make: Callable, steps: int) -> None:
    """Two gloo ranks, each on half of every batch (tasks listed in different orders), hold the same state, and
    it is the state of one process on the whole batch (the losses are averaged across ranks by name)."""
    r0, _ = run_ddp(tmp_path, make, steps)
    model = pair_model()
    bal = make(list(TASKS), model)
    train(model, bal, range(steps))
    for key, value in bal.state_dict().items():
        if key.endswith("_extra_state"):
            assert torch.equal(r0["state"][key]["generator"], value["generator"])
        else:
            torch.testing.assert_close(r0["state"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    for p0, p in zip(r0["params"], model.parameters()):
        torch.testing.assert_close(p0, p.detach(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- three tasks, seeded

TASKS3 = ("a", "b", "c")
SCALES = {"a": 1.0, "b": 5.0, "c": 0.3, "d": 2.0}


def make_model(tasks: Sequence[str] = TASKS3, seed: int = 0, width: int = 5) -> MultiTaskModel:
    torch.manual_seed(seed)
    trunk = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, width), nn.Tanh())
    heads = {t: nn.Linear(width, 2 if t == "b" else 1) for t in tasks}
    return MultiTaskModel(trunk, heads, last_shared_layer=trunk[2])


def batch(tasks: Sequence[str] = TASKS3, seed: int = 1, n: int = 6) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, {t: SCALES[t] * torch.randn(n, 2 if t == "b" else 1, generator=g) for t in tasks}


def task_losses(model: MultiTaskModel, x: torch.Tensor, y: dict[str, torch.Tensor]):
    out = model(x)
    return out, {t: F.mse_loss(out.preds[t], y[t]) for t in y}


def train_ours(
    model: MultiTaskModel, balancer, steps: int, tasks: Sequence[str] = TASKS3, lr: float = 0.1, ctx=None, opt=None
) -> list[Metrics]:
    opt = opt or torch.optim.SGD(model.parameters(), lr=lr)
    history = []
    for step in range(steps):
        x, y = batch(tasks, seed=step)
        opt.zero_grad()
        out, losses = task_losses(model, x, y)
        metrics = balancer.backward(losses, out.shared, ctx)
        opt.step()
        metrics |= balancer.step()
        history.append(metrics)
    return history


def assert_same_parameters(ours: nn.Module, reference: nn.Module, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for (name, p), q in zip(ours.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def shared_lr_groups(model: MultiTaskModel, lr: float, shared_factor: float) -> list[dict]:
    """SGD groups with the trunk's learning rate times `shared_factor` (a reference scaled by a constant)."""
    return [
        {"params": list(model.trunk.parameters()), "lr": lr * shared_factor},
        {"params": list(model.heads.parameters()), "lr": lr},
    ]


def assert_per_task_is_the_joint_step(
    build: Callable, order: Sequence[str], ctx=None, scale: float = 1.0, step: bool = True
) -> None:
    """Per-task backwards (tasks in `order`, each on its own forward) give the joint step's gradients (divided
    by the GradScaler's `scale`, if `ctx` has one) and metrics."""
    joint, per_task = make_model(), make_model()
    x, y = batch()
    out, losses = task_losses(joint, x, y)
    expected = build(joint).backward(losses, out.shared)
    bal = build(per_task)
    metrics: Metrics = {}
    for task in order:
        out, losses = task_losses(per_task, x, y)
        metrics |= bal.backward_task(task, losses[task], out.shared, ctx)
    if step:
        metrics |= bal.step()
    assert metrics.keys() == expected.keys()
    for p, q in zip(joint.parameters(), per_task.parameters()):
        torch.testing.assert_close(q.grad / scale, p.grad, rtol=1e-5, atol=1e-7)
    for key in expected:
        torch.testing.assert_close(metrics[key], expected[key], rtol=1e-5, atol=1e-6)


def assert_resume_and_skip_keep_the_state(
    build: Callable, first: int = 2, then: int = 2, resumed_seed: int = 3
) -> dict:
    """Train `first` steps, save, train `then`; a model of another seed loaded from the save trains `then` to
    the same parameters; a skipped step leaves the balancer's state. The saved balancer state."""
    model = make_model()
    bal = build(model)
    train_ours(model, bal, first)
    saved_model, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(bal.state_dict())
    train_ours(model, bal, then)
    again_model = make_model(seed=resumed_seed)
    again_model.load_state_dict(saved_model)
    again = build(again_model)
    again.load_state_dict(saved)
    train_ours(again_model, again, then)
    assert_same_parameters(again_model, model, rtol=0, atol=0)

    before = copy.deepcopy(bal.state_dict())
    x, y = batch()
    out, losses = task_losses(model, x, y)
    bal.backward(losses, out.shared, BackwardContext())
    bal.step(torch.tensor(True))
    assert_state_is(bal, before)
    return saved


# ---------------------------------------------------------------------------------------------- references


def libmtl_module(
    name: str, package: str = "weighting", needs: Sequence[str] = ("abstract_weighting",)
) -> types.ModuleType:
    """`benchmarks.peers.libmtl_module`, skipping the test when LibMTL (the peers extra) is not installed."""
    try:
        return peers.libmtl_module(name, package, needs)
    except ModuleNotFoundError as error:
        if error.name != "LibMTL":
            raise
        pytest.skip(str(error))


def load_libmtl(name: str):
    """A LibMTL 1.1.5 weighting class (`libmtl_module`)."""
    return getattr(libmtl_module(name), name)


def libmtl_weighting(name: str, model: MultiTaskModel, tasks: Sequence[str], rep_grad: bool = False):
    """The weighting as LibMTL's trainer mixes it into the model (`benchmarks.peers.libmtl_weighting`)."""
    libmtl_module(name)  # skips without LibMTL
    return peers.libmtl_weighting(name, model, tasks, rep_grad)


def train_libmtl(
    model: MultiTaskModel,
    weighting,
    steps: int,
    tasks: Sequence[str] = TASKS3,
    lr: float = 0.1,
    params: Callable | None = None,
    **kwargs,
) -> list:
    opt = torch.optim.SGD(params() if params else model.parameters(), lr=lr)
    returned = []
    for step in range(steps):
        x, y = batch(tasks, seed=step)
        opt.zero_grad()
        rep = model.trunk(x)
        if weighting.rep_grad:
            weighting.rep = rep
            weighting.rep_tasks = {t: rep.detach().clone().requires_grad_(True) for t in tasks}
            inputs = weighting.rep_tasks
        else:
            inputs = {t: rep for t in tasks}
        losses = torch.stack([F.mse_loss(model.heads[t](inputs[t]), y[t]) for t in tasks])
        returned.append(weighting.backward(losses, **kwargs))
        opt.step()
    return returned


def train_torchjd(
    model: MultiTaskModel, aggregator, steps: int, tasks: Sequence[str] = TASKS3, lr: float = 0.1, opt=None
) -> list:
    autojac = pytest.importorskip("torchjd.autojac")
    opt = opt or torch.optim.SGD(model.parameters(), lr=lr)
    returned = []
    for step in range(steps):
        x, y = batch(tasks, seed=step)
        opt.zero_grad()
        out, losses = task_losses(model, x, y)
        autojac.mtl_backward([losses[t] for t in tasks], features=out.shared)
        returned.append(autojac.jac_to_grad(list(model.trunk.parameters()), aggregator))
        opt.step()
    return returned


def train_scalarizer(
    model: MultiTaskModel, objective: Callable[[torch.Tensor], torch.Tensor], steps: int, tasks=TASKS3, lr=0.1
) -> None:
    """SGD on `objective(stacked losses)` with a plain backward: a reference loss-level method (torchjd's
    scalarizers, a paper's formula) on the seeded three-task case."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = batch(tasks, seed=step)
        opt.zero_grad()
        _, losses = task_losses(model, x, y)
        objective(torch.stack([losses[t] for t in tasks])).backward()
        opt.step()


def conflicting_gramians(seed: int, tasks: Sequence[int] = (2, 3, 5, 10), per_size: int = 10) -> Iterator[np.ndarray]:
    """Gramians of random Jacobians (20 columns) whose first half of rows partly opposes the second half."""
    rng = np.random.default_rng(seed)
    for t in tasks:
        for _ in range(per_size):
            jac = rng.normal(size=(t, 20))
            jac[: t // 2] -= rng.uniform(0, 1.5) * jac[t // 2 : t // 2 * 2]
            yield jac @ jac.T


def built_kernel_or_skip(load: Callable[[], object], what: str) -> Any:
    """A C++ kernel from its loader (about 30 s the first time on a machine, then cached); skip where it cannot be
    built."""
    module = load()
    if module is None:
        pytest.skip(f"the {what} cannot be built here (its warning says why)")
    return module


def on_one_and_two_threads(run: Callable[[], Any]) -> tuple[Any, Any]:
    """`run()` with torch on 1 thread, then on 2 (the thread count restored after)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(2)
        return one, run()
    finally:
        torch.set_num_threads(threads)
