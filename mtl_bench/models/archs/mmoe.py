"""Multi-gate mixture of experts (Ma et al., KDD 2018; LibMTL 1.1.5 architecture/MMoE.py)."""

from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.archs.base import Architecture, Backbone, check_count, mix


class MMoE(Architecture):
    """`num_experts` copies of the trunk (the experts, shared) and one softmax gate per task, a Linear on the flattened
    input: task t reads sum_e g_t(x)_e expert_e(x).

    As LibMTL: the shared parameters are the experts' (gates are task parameters). The shared representation is the
    experts' stacked outputs (E, N, ...), which every task reads; LibMTL's `rep_grad` takes each task's mixture
    instead (a different tensor per task), so methods at `shared_rep` see the experts' outputs here.
    Measurements: each task's mean gate weight per expert, `arch/gate/<task>/expert<e>`.
    """

    def __init__(self, backbone: Backbone, num_experts: int = 4) -> None:
        """
        backbone: the backbone's trunk and stages (given by the model).
        num_experts: experts shared by all tasks, each a copy of the backbone's trunk (LibMTL's `num_experts`).
        """
        super().__init__()
        self.tasks = list(backbone.tasks)
        self.num_experts = check_count("num_experts", num_experts)
        self.experts_shared = nn.ModuleList(backbone.fresh(num_experts))
        self.gate_specific = nn.ModuleDict(
            {t: nn.Sequential(nn.Linear(backbone.input_size, num_experts), nn.Softmax(dim=-1)) for t in self.tasks}
        )
        self._set_last_layers([backbone.last_layer(e) for e in self.experts_shared])
        self.expert_names = [f"expert{e}" for e in range(num_experts)]

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        return self.experts_shared.parameters()

    def forward(self, x: Tensor, tasks: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
        experts = torch.stack([e(x) for e in self.experts_shared])
        flat = torch.flatten(x, start_dim=1)
        reps = {}
        for task in tasks:
            weights = self.gate_specific[task](flat)
            self._measure_gate(task, weights, self.expert_names)
            reps[task] = mix(experts, weights)
        return experts, reps

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}"
