"""The gradient methods' shared machinery (mtl_bench.balancers.jacobian), and the helpers their tests share:
a tiny hard-parameter-sharing model, SGD runs of our balancers, and the reference implementations
(LibMTL 1.1.5's weighting modules loaded directly from the installed files, torchjd 0.18) on the same model,
data and initial parameters."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import sys
import types
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtl_bench.balancers import BackwardContext
from mtl_bench.balancers.jacobian import gramian, head_params, param_jacobian, grads_at_shared
from mtl_bench.models.base import MultiTaskModel

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


def train_ours(model: MultiTaskModel, balancer, steps: int, tasks: Sequence[str] = TASKS3, lr: float = 0.1,
               ctx=None, opt=None) -> list[dict[str, torch.Tensor]]:
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


# ---------------------------------------------------------------------------------------------- references

def _libmtl_root() -> Path:
    if "LibMTL" in sys.modules:
        return Path(sys.modules["LibMTL"].__path__[0])
    spec = importlib.util.find_spec("LibMTL")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("LibMTL (the peers extra) is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def load_libmtl(name: str):
    """A LibMTL 1.1.5 weighting class, from its installed file; LibMTL's package __init__ imports a
    torchvision module that no longer exists, so the package and subpackage are stand-ins."""
    root = _libmtl_root()
    for package, path in (("LibMTL", root), ("LibMTL.weighting", root / "weighting")):
        if package not in sys.modules or not hasattr(sys.modules[package], "__path__"):
            module = types.ModuleType(package)
            module.__path__ = [str(path)]
            sys.modules[package] = module
    for module_name in ("abstract_weighting", name):
        full = f"LibMTL.weighting.{module_name}"
        if full not in sys.modules:
            module_spec = importlib.util.spec_from_file_location(full, root / "weighting" / f"{module_name}.py")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[full] = module
            module_spec.loader.exec_module(module)
    return getattr(sys.modules[f"LibMTL.weighting.{name}"], name)


def libmtl_weighting(name: str, model: MultiTaskModel, tasks: Sequence[str], rep_grad: bool = False):
    """The weighting as LibMTL's trainer mixes it into the model: shared parameters are the trunk's."""
    base = load_libmtl(name)

    class Weighting(base):
        def __init__(self) -> None:
            super().__init__()
            self.task_num, self.task_name, self.rep_grad = len(tasks), list(tasks), rep_grad
            self.device = torch.device("cpu")
            self.__dict__["encoder"] = model.trunk

        def get_share_params(self):
            return model.trunk.parameters()

        def zero_grad_share_params(self):
            model.trunk.zero_grad(set_to_none=False)

    weighting = Weighting()
    weighting.init_param()
    return weighting


def train_libmtl(model: MultiTaskModel, weighting, steps: int, tasks: Sequence[str] = TASKS3, lr: float = 0.1,
                 params: Callable | None = None, **kwargs) -> list:
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


def train_torchjd(model: MultiTaskModel, aggregator, steps: int, tasks: Sequence[str] = TASKS3, lr: float = 0.1,
                  opt=None) -> list:
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


def assert_same_parameters(ours: nn.Module, reference: nn.Module, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for (name, p), q in zip(ours.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def shared_lr_groups(model: MultiTaskModel, lr: float, shared_factor: float) -> list[dict]:
    """SGD groups with the trunk's learning rate times `shared_factor` (a reference scaled by a constant)."""
    return [{"params": list(model.trunk.parameters()), "lr": lr * shared_factor},
            {"params": list(model.heads.parameters()), "lr": lr}]


@contextlib.contextmanager
def no_host_sync(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def boom(*args, **kwargs):
        raise AssertionError("host sync in the hot path")
    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
            m.setattr(torch.Tensor, name, boom)
        yield


# ---------------------------------------------------------------------------------------------- the machinery

def test_batched_jacobian_equals_per_task_autograd():
    model, (x, y) = make_model(), batch()
    out, losses = task_losses(model, x, y)
    params = list(model.trunk.parameters())
    ids = {id(p) for p in params}
    ordered = [losses[t] for t in TASKS3]
    rows, heads = grads_at_shared(ordered, out.shared, None, ids)
    blocks = param_jacobian(out.shared, params, rows)
    for i, t in enumerate(TASKS3):
        _, fresh = task_losses(model, x, y)
        expected = torch.autograd.grad(fresh[t], params + list(model.heads[t].parameters()))
        for block, e in zip(blocks, expected):
            torch.testing.assert_close(block[i], e)
        assert {id(p) for p, _ in heads[i]} == {id(p) for p in model.heads[t].parameters()}
        for (p, g) in heads[i]:
            index = [id(q) for q in model.heads[t].parameters()].index(id(p))
            torch.testing.assert_close(g, expected[len(params) + index])
    flat = torch.cat([b.reshape(3, -1) for b in blocks], 1)
    torch.testing.assert_close(gramian(blocks), flat @ flat.T)


def test_head_reading_the_trunk_elsewhere_is_refused():
    trunk = nn.Linear(2, 2)
    shared_in = torch.ones(1, 2)
    shared = trunk(shared_in)
    loss = (shared.sum() + trunk.weight.sum())
    with pytest.raises(ValueError, match="shared_params"):
        head_params(loss, shared, {id(p) for p in trunk.parameters()})


# ---------------------------------------------------------------------------------------------- DDP

def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from mtl_bench.balancers import MGDA, PCGrad, UPGrad

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for name, make in (("pcgrad", lambda m: PCGrad(list(TASKS3), list(m.trunk.parameters()), seed=3)),
                           ("mgda", lambda m: MGDA(list(TASKS3), list(m.trunk.parameters()))),
                           ("upgrad", lambda m: UPGrad(list(TASKS3), list(m.trunk.parameters()))),
                           ("mgda_ub", lambda m: MGDA(list(TASKS3), grad_source="shared_rep"))):
            model = make_model()
            ddp = DistributedDataParallel(model)
            bal = make(model)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            checks = []
            for step in range(3):
                x, y = batch(seed=10 * step + rank, n=4 + 2 * rank)
                opt.zero_grad()
                out = ddp(x)
                losses = {t: F.mse_loss(out.preds[t], y[t]) for t in TASKS3}
                metrics = bal.backward(losses, out.shared)
                if name != "mgda_ub":  # the direction DDP gives = mean over ranks of w·J_rank
                    w = torch.stack([metrics[f"weight/{t}"] for t in TASKS3])
                    local_model = copy.deepcopy(model)
                    _, local = task_losses(local_model, x, y)
                    rows = [torch.autograd.grad(local[t], list(local_model.trunk.parameters()), retain_graph=True)
                            for t in TASKS3]
                    local_dir = [sum(w[i] * rows[i][k] for i in range(3)) for k in range(len(rows[0]))]
                    for d in local_dir:
                        dist.all_reduce(d)
                        d /= world
                    checks.append(max((p.grad - d).abs().max().item() for p, d in zip(model.trunk.parameters(), local_dir)))
                opt.step()
                bal.step()
            results[name] = {"params": [p.detach().clone() for p in model.parameters()], "checks": checks,
                             "weights": [metrics[f"weight/{t}"].item() for t in TASKS3]}
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_ranks_agree_and_ddp_averages_the_direction(tmp_path: Path):
    """2 gloo processes with different batches: the Gramian is averaged before the solve, so both ranks get
    the same weights; our one autograd write of w·J fires DDP's hooks, so DDP averages it over the ranks."""
    from processes import spawn_and_wait

    spawn_and_wait(_ddp_worker, (2, str(tmp_path / "init"), str(tmp_path)), 2, 240, "gradient balancers under DDP hung")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for name in r0:
        assert r0[name]["weights"] == r1[name]["weights"], name
        for p, q in zip(r0[name]["params"], r1[name]["params"]):
            assert torch.equal(p, q), name
        assert all(c < 1e-6 for c in r0[name]["checks"] + r1[name]["checks"]), (name, r0[name]["checks"])
