"""model=mpnn against nash-mtl's `Net` (benchmarks/nash_mtl_net.py, adapted from their code): the same outputs and
gradients given the same parameters, although ours computes the edge network once per forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torch_geometric")

from torch_geometric.data import Batch, Data  # noqa: E402

from benchmarks.nash_mtl_net import ReferenceNet  # noqa: E402
from mtl_bench.models.mpnn import MPNN  # noqa: E402

NAMES = ["mu", "alpha", "homo"]


def random_batch(sizes, seed=0) -> Batch:
    """Complete graphs (every ordered pair): 4 bond one-hots (zero on non-bonds) + a distance, as the task set."""
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for n in sizes:
        rows, cols = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        keep = rows != cols
        edge_index = torch.stack([rows[keep], cols[keep]])
        bonds = F.one_hot(torch.randint(0, 4, (edge_index.shape[1],), generator=gen), 4).float()
        bonds *= (torch.rand(edge_index.shape[1], 1, generator=gen) < 0.3).float()
        dist = torch.rand(edge_index.shape[1], 1, generator=gen) * 3
        x = torch.rand(n, 11, generator=gen)
        graphs.append(Data(x=x, edge_index=edge_index, edge_attr=torch.cat([bonds, dist], 1)))
    return Batch.from_data_list(graphs)


def copy_reference(model: MPNN, ref: ReferenceNet) -> None:
    state = {f"trunk.{k}": v for k, v in ref.state_dict().items() if not k.startswith("task_specific")}
    for i, name in enumerate(NAMES):
        state[f"heads.{name}.weight"] = ref.task_specific[i].weight
        state[f"heads.{name}.bias"] = ref.task_specific[i].bias
    model.load_state_dict(state)  # strict: every parameter of ours has its counterpart


def test_same_outputs_and_gradients_as_the_reference_net():
    torch.manual_seed(0)
    ref = ReferenceNet(len(NAMES))
    model = MPNN((11,), {name: 1 for name in NAMES})
    copy_reference(model, ref)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    data = random_batch([5, 9, 3, 18])
    logits, features = ref(data)
    out = model(data)
    torch.testing.assert_close(out.shared, features, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([out.preds[n] for n in NAMES], 1), logits, rtol=1e-5, atol=1e-5)
    logits.square().sum().backward()
    sum(p.square().sum() for p in out.preds.values()).backward()
    grads = {f"trunk.{k}": p.grad for k, p in ref.named_parameters() if not k.startswith("task_specific")}
    for name, p in model.trunk.named_parameters(prefix="trunk"):
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-5)


def test_paper_size_shared_parameters_and_last_shared_layer():
    model = MPNN((11,), {f"t{i}": 1 for i in range(11)})
    assert sum(p.numel() for p in model.parameters()) == 617_675  # nash-mtl's Net with 11 heads
    assert sum(p.numel() for p in model.shared_parameters()) == 617_675 - 11 * 65
    assert model.last_shared_layer is model.trunk.lin1


def test_the_edge_network_runs_once_per_forward():
    model = MPNN((11,), {"mu": 1})
    calls = []
    model.trunk.conv.nn[0].register_forward_hook(lambda *args: calls.append(1))
    model(random_batch([4, 6]))
    assert len(calls) == 1


def test_bad_shape_is_one_line():
    with pytest.raises(ValueError, match=r"^input_shape: MPNN needs \(node features,\)"):
        MPNN((3, 8, 8), {"mu": 1})
