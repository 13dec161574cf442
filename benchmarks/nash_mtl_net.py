"""nash-mtl's QM9 `Net` (AvivNavon/nash-mtl cce1840, experiments/quantum_chemistry/models.py, MIT licence), adapted:
heads as one ModuleList, the forward returning (logits, features). The reference that model=mpnn is tested and
timed against (tests/models/test_mpnn.py, scripts/bench_mpnn.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import NNConv, Set2Set


class ReferenceNet(nn.Module):
    """nash-mtl's `Net` (their code, heads as a ModuleList)."""

    def __init__(self, n_tasks: int, num_features: int = 11, dim: int = 64) -> None:
        super().__init__()
        self.lin0 = nn.Linear(num_features, dim)
        edge_net = nn.Sequential(nn.Linear(5, 128), nn.ReLU(), nn.Linear(128, dim * dim))
        self.conv = NNConv(dim, dim, edge_net, aggr="mean")
        self.gru = nn.GRU(dim, dim)
        self.set2set = Set2Set(dim, processing_steps=3)
        self.lin1 = nn.Linear(2 * dim, dim)
        self.task_specific = nn.ModuleList([nn.Linear(dim, 1) for _ in range(n_tasks)])

    def forward(self, data):
        out = F.relu(self.lin0(data.x))
        h = out.unsqueeze(0)
        for _ in range(3):
            m = F.relu(self.conv(out, data.edge_index, data.edge_attr))
            out, h = self.gru(m.unsqueeze(0), h)
            out = out.squeeze(0)
        out = self.set2set(out, data.batch)
        features = F.relu(self.lin1(out))
        return torch.cat([head(features) for head in self.task_specific], dim=1), features
