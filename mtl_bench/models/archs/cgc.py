"""Customized gate control, PLE's single level (Tang et al., RecSys 2020; LibMTL 1.1.5 architecture/CGC.py)."""

from __future__ import annotations

import typing
from typing import Iterator, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.archs.base import Architecture, Backbone, check_count, mix


class CGC(Architecture):
    """`num_shared` experts shared by all tasks and `num_specific` experts of each task's own, all copies of the
    trunk; task t's softmax gate (a Linear on the flattened input) mixes the shared experts and its own.

    As LibMTL: the shared parameters are the shared experts' (task experts and gates are task parameters); the
    shared representation is the shared experts' stacked outputs (LibMTL's `rep_grad`: each task's mixture).
    Measurements: `arch/gate/<task>/shared<e>` and `arch/gate/<task>/own<e>`, each task's mean gate weights.
    """

    def __init__(self, backbone: Backbone, num_shared: int = 1, num_specific: int = 1) -> None:
        """
        backbone: the backbone's trunk and stages (given by the model).
        num_shared: experts shared by all tasks (LibMTL's `num_experts[0]`).
        num_specific: experts of each task's own (LibMTL's `num_experts[1:]`, here the same for every task).
        """
        super().__init__()
        self.tasks = list(backbone.tasks)
        self.num_shared = check_count("num_shared", num_shared)
        self.num_specific = check_count("num_specific", num_specific, minimum=0)
        self.experts_shared = nn.ModuleList(backbone.fresh(num_shared))
        self.experts_specific = nn.ModuleDict(
            {t: nn.ModuleList(backbone.fresh(num_specific, reuse=False)) for t in self.tasks}
        )
        width = num_shared + num_specific
        self.gate_specific = nn.ModuleDict(
            {t: nn.Sequential(nn.Linear(backbone.input_size, width), nn.Softmax(dim=-1)) for t in self.tasks}
        )
        self._set_last_layers([backbone.last_layer(e) for e in self.experts_shared])
        self.expert_names = [f"shared{e}" for e in range(num_shared)] + [f"own{e}" for e in range(num_specific)]

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        return self.experts_shared.parameters()

    def forward(self, x: Tensor, tasks: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
        shared = torch.stack([e(x) for e in self.experts_shared])
        flat = torch.flatten(x, start_dim=1)
        reps = {}
        for task in tasks:
            experts = torch.cat([shared, *(e(x).unsqueeze(0) for e in self._own(task))])
            weights = self.gate_specific[task](flat)
            self._measure_gate(task, weights, self.expert_names)
            reps[task] = mix(experts, weights)
        return shared, reps

    def _own(self, task: str) -> list[nn.Module]:
        return list(typing.cast(nn.ModuleList, self.experts_specific[task]))

    def extra_repr(self) -> str:
        return f"num_shared={self.num_shared}, num_specific={self.num_specific}"
