"""Under DDP (2 CPU processes, gloo) both balancers average their statistics by name: every rank ends with the
same weights, and the averaged norms are the (batch-size weighted) means of the ranks' own norms."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mtl_bench.balancers import GradNorm, RescaledNormBalancer
from mtl_bench.gradient_engine.rank_average import average_by_name
from mtl_bench.models.base import MultiTaskModel
from tests.helpers.processes import spawn_and_wait

TASKS = ("a", "b", "c")
STEPS = 3


def rescaled(weights, **options):
    """A RescaledNormBalancer over the tasks of `weights`."""
    return RescaledNormBalancer(list(weights), weights=weights, **options)


def make_model() -> MultiTaskModel:
    torch.manual_seed(0)  # the same initial model on every rank
    trunk = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 5), nn.Tanh())
    heads = {"a": nn.Linear(5, 1), "b": nn.Linear(5, 2), "c": nn.Linear(5, 1)}
    return MultiTaskModel(trunk, heads, last_shared_layer=trunk[2])


def rank_batch(rank: int, step: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 * rank + step)
    n = 4 + 2 * rank  # different batch sizes: the rescaled-norm mean is weighted by them
    return torch.randn(n, 3, generator=g), {
        k: s * torch.randn(n, 2 if k == "b" else 1, generator=g) for k, s in (("a", 1.0), ("b", 5.0), ("c", 0.3 + rank))
    }


def local_norms(losses: dict[str, torch.Tensor], shared: torch.Tensor, layer: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's own statistics, with plain autograd (no balancer, no reduction)."""
    result = {}
    for t in TASKS:
        (g,) = torch.autograd.grad(losses[t], shared, retain_graph=True)
        result[f"rn/{t}"] = g.norm(dim=1).mean()
        grads = torch.autograd.grad(losses[t], list(layer.parameters()), retain_graph=True)
        result[f"gn/{t}"] = torch.sqrt(sum((x**2).sum() for x in grads))
    return result


def worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = make_model()
        ddp = DistributedDataParallel(model)
        names = list(TASKS) if rank == 0 else ["c", "a", "b"]  # a different order on each rank
        balancers = {
            "gn": GradNorm(names, shared_layer=model.last_shared_layer, lr=0.1),
            "rn": rescaled({t: {"a": 1.0, "b": 2.0, "c": 0.5}[t] for t in names}, ema_decay=0.9),
        }
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        first: dict[str, dict[str, torch.Tensor]] = {}
        for step in range(STEPS):
            x, y = rank_batch(rank, step)
            for key, bal in balancers.items():
                opt.zero_grad()
                out = ddp(x)
                losses = {t: F.mse_loss(out.preds[t], y[t]) for t in names}
                if step == 0:
                    first[f"local_{key}"] = local_norms(losses, out.shared, model.last_shared_layer)
                metrics = bal.backward(losses, out.shared)
                opt.step()
                bal.step()
                if step == 0:
                    first[key] = metrics
        # Matched by name, whatever the insertion order on each rank; mismatched names fail loudly.
        pairs = [("x", torch.tensor(float(rank))), ("y", torch.tensor(10.0 + rank))]
        mean = average_by_name(dict(pairs if rank == 0 else pairs[::-1]))
        assert (mean["x"].item(), mean["y"].item()) == (0.5, 10.5)
        with pytest.raises(RuntimeError, match="different statistics"):
            average_by_name({f"only_on_rank_{rank}": torch.ones(())})
        torch.save(
            {
                "state": {k: b.state_dict() for k, b in balancers.items()},
                "first": first,
                "order": balancers["gn"].task_names,
                "batch": len(rank_batch(rank, 0)[0]),
                "params": [p.detach() for p in model.parameters()],
            },
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def by_name(result: dict, balancer: str, buffer: str) -> dict[str, float]:
    values = result["state"][balancer][buffer].tolist()
    return dict(zip(result["order"], values))


def test_two_gloo_ranks_hold_identical_weights(tmp_path: Path):
    spawn_and_wait(
        worker,
        (2, str(tmp_path / "init"), str(tmp_path)),
        nprocs=2,
        timeout_s=90,
        what="DDP workers did not finish (a collective mismatch hangs)",
    )
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))

    for p0, p1 in zip(r0["params"], r1["params"]):
        assert torch.equal(p0, p1)  # DDP sanity: one model
    for balancer, buffer in (
        ("gn", "weights"),
        ("gn", "exp_avg_sq"),
        ("gn", "initial_losses"),
        ("rn", "ema_sum"),
        ("rn", "weights"),
    ):
        assert by_name(r0, balancer, buffer) == by_name(r1, balancer, buffer), (balancer, buffer)
    assert by_name(r0, "gn", "weights") != pytest.approx({t: 1.0 for t in TASKS})  # the weights moved

    c0, c1 = r0["batch"], r1["batch"]
    for t in TASKS:
        n0, n1 = r0["first"]["local_gn"][f"gn/{t}"].item(), r1["first"]["local_gn"][f"gn/{t}"].item()
        for r in (r0, r1):
            assert r["first"]["gn"][f"grad_norm/{t}"].item() == pytest.approx((n0 + n1) / 2, rel=1e-5)
        n0, n1 = r0["first"]["local_rn"][f"rn/{t}"].item(), r1["first"]["local_rn"][f"rn/{t}"].item()
        for r in (r0, r1):
            assert r["first"]["rn"][f"grad_norm/{t}"].item() == pytest.approx((c0 * n0 + c1 * n1) / (c0 + c1), rel=1e-5)
