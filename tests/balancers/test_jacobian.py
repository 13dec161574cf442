"""The gradient methods' shared machinery (mtl_bench.gradient_engine.gradient_balancer and the modules it uses); the
helpers their tests share are in balancer_kit."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtl_bench.balancers import IMTL, MGDA, BackwardContext, GradVac, PCGrad, UPGrad
from mtl_bench.gradient_engine.blocks import combine, flat_rows, rows_like
from mtl_bench.gradient_engine.gramian import gramian
from mtl_bench.gradient_engine.graph import head_params
from mtl_bench.gradient_engine.leaf_grads import write_leaf_grads
from mtl_bench.gradient_engine.task_grads import grads_at_shared, task_jacobian
from tests.helpers.balancer_kit import TASKS3, batch, make_model, no_host_sync, task_losses
from tests.helpers.param_jacobian import param_jacobian

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
        for p, g in heads[i]:
            index = [id(q) for q in model.heads[t].parameters()].index(id(p))
            torch.testing.assert_close(g, expected[len(params) + index])
    flat = torch.cat([b.reshape(3, -1) for b in blocks], 1)
    torch.testing.assert_close(gramian(blocks), flat @ flat.T)


def test_task_jacobian_equals_per_task_autograd_and_reuses_its_blocks():
    """The per-task backwards into blocks, the Gramian and the combination, and the next step's rows written into
    the same storage: all equal to plain per-task autograd and to a contiguous Jacobian."""
    model, (x, y) = make_model(), batch()
    params = list(model.trunk.parameters())
    ids = {id(p) for p in params}
    previous = None
    for _ in range(2):
        out, losses = task_losses(model, x, y)
        blocks, heads = task_jacobian([losses[t] for t in TASKS3], out.shared, params, None, ids, previous)
        if previous is not None:
            assert [b.data_ptr() for b in blocks] == [b.data_ptr() for b in previous]
        for i, t in enumerate(TASKS3):
            _, fresh = task_losses(model, x, y)
            expected = torch.autograd.grad(fresh[t], params + list(model.heads[t].parameters()))
            for block, e in zip(blocks, expected):
                torch.testing.assert_close(block[i], e)
            assert [id(p) for p, _ in heads[i]] == [id(p) for p in model.heads[t].parameters()]
        flat = torch.cat([b.reshape(3, -1) for b in blocks], 1)
        torch.testing.assert_close(gramian(blocks), flat @ flat.T)
        w = torch.tensor([0.5, -1.0, 2.0])
        for d, block in zip(combine(blocks, w), blocks):
            torch.testing.assert_close(d, (w.view(-1, *[1] * (block.dim() - 1)) * block).sum(0))
        previous = blocks
        x = x + 1  # the next step's batch


def test_rows_laid_out_like_a_transposed_gradient():
    """A large Linear's weight gradient comes transposed from autograd: the rows copy it straight, and the Gramian
    and the combination (flat in memory order) equal those of the contiguous Jacobian."""
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(7, 5, generator=g).T for _ in range(3)]  # (5, 7) with strides (1, 5)
    block = rows_like(grads[0], 3)
    for i, grad in enumerate(grads):
        block[i].copy_(grad)
    assert block[0].stride() == grads[0].stride() and flat_rows(block).data_ptr() == block.data_ptr()
    dense = torch.stack(grads)
    torch.testing.assert_close(gramian([block]), gramian([dense]))
    w = torch.tensor([0.5, -1.0, 2.0])
    torch.testing.assert_close(combine([block], w)[0], 0.5 * grads[0] - grads[1] + 2 * grads[2])


def test_leaf_gradients_are_handed_over_without_a_copy_and_as_a_plain_backward():
    """write_leaf_grads: a leaf without `.grad` keeps the handed tensor itself; one with `.grad` gets the sum in place;
    a leaf twice gets both; a tensor hook changes what lands and a post-accumulate hook sees it, as with
    autograd.backward; a gradient someone still holds is copied; fp16 gradients become the leaf's dtype."""
    fresh, held, twice, hooked = (nn.Parameter(torch.zeros(4, 3)) for _ in range(4))
    old = torch.ones(4, 3)
    held.grad = old
    mine, kept = torch.full((4, 3), 2.0), torch.full((4, 3), 3.0)
    seen: list[Tensor] = []
    hooked.register_hook(lambda g: g * 10)
    hooked.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    pairs = [(fresh, torch.full((4, 3), 5.0)), (held, kept), (twice, mine), (twice, mine.half()), (hooked, kept)]
    pointer = pairs[0][1].data_ptr()
    with torch.no_grad():
        write_leaf_grads(pairs)
    assert pairs == []  # handed over
    assert fresh.grad is not None and fresh.grad.data_ptr() == pointer
    assert torch.equal(fresh.grad, torch.full((4, 3), 5.0))
    assert held.grad is old and torch.equal(old, torch.full((4, 3), 4.0))
    assert twice.grad is not None and twice.grad.dtype == torch.float32
    assert torch.equal(twice.grad, torch.full((4, 3), 4.0))
    assert hooked.grad is not None and torch.equal(hooked.grad, torch.full((4, 3), 30.0))
    assert hooked.grad.data_ptr() != kept.data_ptr() and len(seen) == 1 and torch.equal(seen[0], hooked.grad)
    assert torch.equal(kept, torch.full((4, 3), 3.0))  # a held gradient is copied, never aliased


def test_head_reading_the_trunk_elsewhere_is_refused():
    trunk = nn.Linear(2, 2)
    shared_in = torch.ones(1, 2)
    shared = trunk(shared_in)
    loss = shared.sum() + trunk.weight.sum()
    with pytest.raises(ValueError, match="shared_params"):
        head_params(loss, shared, {id(p) for p in trunk.parameters()})


@pytest.mark.parametrize(
    ("method", "options"),
    [(IMTL, {}), (MGDA, {}), (UPGrad, {}), (PCGrad, {"seed": 0}), (GradVac, {"seed": 0})],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_no_host_sync_on_cpu(method, options: dict, monkeypatch: pytest.MonkeyPatch):
    model, (x, y) = make_model(), batch()
    bal = method(list(TASKS3), list(model.trunk.parameters()), **options)
    with no_host_sync(host_solve_of=bal):  # each names its host solve: that is its one sync
        out, losses = task_losses(model, x, y)
        bal.backward(losses, out.shared, BackwardContext(scaler=torch.amp.GradScaler("cpu")))
        bal.step()


# ---------------------------------------------------------------------------------------------- DDP


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from mtl_bench.balancers import MGDA, PCGrad, UPGrad

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for name, make in (
            ("pcgrad", lambda m: PCGrad(list(TASKS3), list(m.trunk.parameters()), seed=3)),
            ("mgda", lambda m: MGDA(list(TASKS3), list(m.trunk.parameters()))),
            ("upgrad", lambda m: UPGrad(list(TASKS3), list(m.trunk.parameters()))),
            ("mgda_ub", lambda m: MGDA(list(TASKS3), grad_source="shared_rep")),
        ):
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
                    rows = [
                        torch.autograd.grad(local[t], list(local_model.trunk.parameters()), retain_graph=True)
                        for t in TASKS3
                    ]
                    local_dir = [sum(w[i] * rows[i][k] for i in range(3)) for k in range(len(rows[0]))]
                    for d in local_dir:
                        dist.all_reduce(d)
                        d /= world
                    checks.append(
                        max((p.grad - d).abs().max().item() for p, d in zip(model.trunk.parameters(), local_dir))
                    )
                opt.step()
                bal.step()
            results[name] = {
                "params": [p.detach().clone() for p in model.parameters()],
                "checks": checks,
                "weights": [metrics[f"weight/{t}"].item() for t in TASKS3],
            }
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_ranks_agree_and_ddp_averages_the_direction(tmp_path: Path):
    """2 gloo processes with different batches: the Gramian is averaged before the solve, so both ranks get
    the same weights; our one autograd write of w·J fires DDP's hooks, so DDP averages it over the ranks."""
    from tests.helpers.processes import spawn_and_wait

    spawn_and_wait(_ddp_worker, (2, str(tmp_path / "init"), str(tmp_path)), 2, 240, "gradient balancers under DDP hung")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for name in r0:
        assert r0[name]["weights"] == r1[name]["weights"], name
        for p, q in zip(r0[name]["params"], r1[name]["params"]):
            assert torch.equal(p, q), name
        assert all(c < 1e-6 for c in r0[name]["checks"] + r1[name]["checks"]), (name, r0[name]["checks"])
