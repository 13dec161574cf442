"""Nash-MTL's QM9 model (AvivNavon/nash-mtl cce1840, experiments/quantum_chemistry/models.py `Net`; Gilmer et al.
2017's MPNN as in PyG's examples/qm9_nn_conv.py), computing its edge network once per forward.

Their `Net` calls `NNConv` in each of its 3 message-passing steps, and `NNConv` runs the edge network (Linear(5, 128),
ReLU, Linear(128, dim * dim)) on every edge each time, although its input (bond type, distance) and its weights are
the same in all 3 steps, and forms a dim x dim matrix per edge (~25k per batch of 120). Here the edge network's
hidden layer is computed once per forward and its last Linear is applied on the node side (EdgeConv): the same
outputs (tested against their module given the same parameters), a fraction of the work.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from mtl_bench.models.base import MultiTaskModel

INSTALL = "pip install 'mtl-bench[chem]'"


class EdgeConv(nn.Module):
    """PyG's `NNConv(dim, dim, edge_net, aggr="mean")` with edge_net = Linear(edge_dim, hidden), ReLU,
    Linear(hidden, dim * dim) (same parameter names: nn, lin, bias): out_i = mean over edges (j -> i) of
    x_j W(e_ji) + lin(x_i) + bias, where W(e) = A h(e) + b as a dim x dim matrix and h(e) the edge net's hidden
    layer.

    Never forms W(e): x_j W(e) = Q_j h(e) + x_j B, with Q_j = x_j contracted with A (dim x hidden, one per node) and
    B = b as a dim x dim matrix. Per step that is one (nodes x dim) @ (dim x dim*hidden) product and one batched
    product over each node's outgoing edges, instead of a dim x dim matrix per edge: the same numbers, a fraction
    of the work and memory. `edges(...)` computes h and the grouping once per forward.
    """

    def __init__(self, dim: int, edge_dim: int, hidden: int) -> None:
        super().__init__()
        self.dim, self.hidden = dim, hidden
        self.nn = nn.Sequential(nn.Linear(edge_dim, hidden), nn.ReLU(), nn.Linear(hidden, dim * dim))
        self.lin = nn.Linear(dim, dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(dim))

    def edges(self, edge_attr: Tensor, edge_index: Tensor, num_nodes: int) -> Edges:
        """The edge net's hidden layer and each edge's slot among its source's outgoing edges, for every step."""
        src, dst = edge_index
        hidden = self.nn[1](self.nn[0](edge_attr))
        ones = torch.ones_like(src)
        out_degree = torch.zeros(num_nodes, dtype=torch.long, device=src.device).index_add_(0, src, ones)
        first = out_degree.cumsum(0) - out_degree  # where each source's edges start once sorted by source
        order = torch.argsort(src, stable=True)
        slot = torch.empty_like(src)
        slot[order] = torch.arange(src.shape[0], device=src.device) - first[src[order]]
        width = int(out_degree.max()) if src.numel() else 0  # one host read per forward: the padding width
        grouped = hidden.new_zeros(num_nodes, width, self.hidden)
        grouped[src, slot] = hidden
        in_degree = torch.zeros(num_nodes, device=src.device).index_add_(0, dst, ones.float())
        return Edges(src, dst, slot, grouped, (1.0 / in_degree.clamp(min=1)).unsqueeze(1))  # PyG's mean

    def forward(self, x: Tensor, edges: Edges) -> Tensor:
        last = typing.cast(nn.Linear, self.nn[2])
        q = (x @ last.weight.view(self.dim, self.dim * self.hidden)).view(-1, self.dim, self.hidden)  # Q[n, k, l]
        per_source = torch.bmm(edges.grouped, q.transpose(1, 2))  # (nodes, out-degree, dim): Q_j h(e)
        messages = per_source[edges.src, edges.slot] + (x @ last.bias.view(self.dim, self.dim))[edges.src]
        summed = messages.new_zeros(x.shape[0], self.dim).index_add_(0, edges.dst, messages)
        return summed * edges.inv_degree.to(summed.dtype) + self.lin(x) + self.bias


@dataclass
class Edges:
    src: Tensor
    dst: Tensor
    slot: Tensor  # position of each edge among its source's outgoing edges
    grouped: Tensor  # (nodes, max out-degree, hidden): h(e) of each node's outgoing edges, zero-padded
    inv_degree: Tensor  # (nodes, 1): 1 / max(in-degree, 1)


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
        edges = self.conv.edges(data.edge_attr, data.edge_index, out.shape[0])  # once, for every step
        for _ in range(self.steps):
            m = F.relu(self.conv(out, edges))
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
