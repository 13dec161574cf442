"""Nash-MTL's QM9 model (AvivNavon/nash-mtl cce1840, experiments/quantum_chemistry/models.py `Net`; Gilmer et al.
2017's MPNN as in PyG's examples/qm9_nn_conv.py), computing its edge network once per forward.

Their `Net` calls `NNConv` in each of its 3 message-passing steps, and `NNConv` runs the edge network (Linear(5, 128),
ReLU, Linear(128, dim * dim)) on every edge each time, although its input (bond type, distance) and its weights are
the same in all 3 steps. Here the per-edge matrices are computed once and reused: the same outputs (tested against
their module given the same parameters), ~3x less of the work that dominates a step.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from mtl_bench.models.base import MultiTaskModel

INSTALL = "pip install 'mtl-bench[chem]'"


class EdgeConv(nn.Module):
    """PyG's `NNConv(dim, dim, edge_net, aggr="mean")` (same parameter names: nn, lin, bias), with the per-edge
    weight matrices given by the caller: out_i = mean over edges (j -> i) of x_j W(e_ji) + lin(x_i) + bias."""

    def __init__(self, dim: int, edge_dim: int, hidden: int) -> None:
        super().__init__()
        self.dim = dim
        self.nn = nn.Sequential(nn.Linear(edge_dim, hidden), nn.ReLU(), nn.Linear(hidden, dim * dim))
        self.lin = nn.Linear(dim, dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(dim))

    def edge_weights(self, edge_attr: Tensor) -> Tensor:
        """(E, dim, dim): one matrix per edge, computed once per forward."""
        return self.nn(edge_attr).view(-1, self.dim, self.dim)

    def forward(self, x: Tensor, edge_index: Tensor, weights: Tensor, inv_degree: Tensor) -> Tensor:
        src, dst = edge_index
        messages = torch.bmm(x[src].unsqueeze(1), weights).squeeze(1)
        summed = messages.new_zeros(x.shape[0], self.dim).index_add_(0, dst, messages)
        return summed * inv_degree.to(summed.dtype) + self.lin(x) + self.bias


class MPNNTrunk(nn.Module):
    """Linear + ReLU; `steps` x (EdgeConv + ReLU, GRU) with shared weights; Set2Set; Linear + ReLU (`lin1`, the
    last shared layer). Reads a PyG `Batch`: x, edge_index, edge_attr, batch, num_graphs."""

    def __init__(self, num_features: int, dim: int, edge_dim: int, edge_hidden: int, steps: int) -> None:
        try:
            from torch_geometric.nn import Set2Set
        except ImportError as err:
            raise ImportError(f"model=mpnn needs torch_geometric: {INSTALL}") from err
        super().__init__()
        self.steps = steps
        self.lin0 = nn.Linear(num_features, dim)
        self.conv = EdgeConv(dim, edge_dim, edge_hidden)
        self.gru = nn.GRU(dim, dim)
        self.set2set = Set2Set(dim, processing_steps=3)
        self.lin1 = nn.Linear(2 * dim, dim)

    def forward(self, data: Any) -> Tensor:
        out = F.relu(self.lin0(data.x))
        h = out.unsqueeze(0)
        weights = self.conv.edge_weights(data.edge_attr)  # once, for every step
        dst = data.edge_index[1]
        degree = torch.zeros(out.shape[0], device=out.device).index_add_(
            0, dst, torch.ones_like(dst, dtype=torch.float)
        )
        inv_degree = (1.0 / degree.clamp(min=1)).unsqueeze(1)  # PyG's mean: sum / max(count, 1)
        for _ in range(self.steps):
            m = F.relu(self.conv(out, data.edge_index, weights, inv_degree))
            out, h = self.gru(m.unsqueeze(0), h)
            out = out.squeeze(0)
        out = self.set2set(out, data.batch, dim_size=data.num_graphs)  # dim_size: no host sync to find it
        return F.relu(self.lin1(out))


class MPNN(MultiTaskModel):
    """Nash-MTL's `Net`: the trunk above, then one Linear(dim, out_dim) head per task. Shared parameters: the
    trunk's (their `shared_parameters`); last shared layer: `lin1` (their `last_shared_parameters`)."""

    def __init__(
        self,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        dim: int = 64,
        edge_dim: int = 5,
        edge_hidden: int = 128,
        steps: int = 3,
    ) -> None:
        """
        input_shape: (node features,) (given by the engine from the task set; 11 for QM9).
        heads: each task's output width (given by the engine from the task set).
        dim: hidden width of the nodes (64 in nash-mtl).
        edge_dim: edge features (5 in nash-mtl: 4 bond one-hots and the distance).
        edge_hidden: hidden width of the edge network (128 in nash-mtl).
        steps: message-passing steps sharing one set of weights (3 in nash-mtl).
        """
        if len(input_shape) != 1 or int(input_shape[0]) <= 0:
            raise ValueError(f"input_shape: MPNN needs (node features,), got {tuple(input_shape)!r}")
        for key, value in (("dim", dim), ("edge_dim", edge_dim), ("edge_hidden", edge_hidden), ("steps", steps)):
            if value <= 0:
                raise ValueError(f"{key}: must be > 0, got {value}")
        trunk = MPNNTrunk(int(input_shape[0]), dim, edge_dim, edge_hidden, steps)
        super().__init__(trunk, {name: nn.Linear(dim, out_dim) for name, out_dim in heads.items()}, trunk.lin1)
