"""Progressive layered extraction (Tang et al., RecSys 2020; LibMTL 1.1.5 architecture/PLE.py)."""

from __future__ import annotations

import math
import typing
from typing import Iterator, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.archs.base import Architecture, Backbone, check_count, mix


class PLE(Architecture):
    """CGC at every level of the backbone (its stem, if any, then each stage): at level i task t's softmax gate (a
    Linear on t's flattened representation) mixes the level's shared experts and t's own experts, all applied to t's
    representation from level i - 1; experts are copies of the trunk cut into levels.

    As LibMTL, and unlike the paper, there is no gate for the shared experts: they run on each task's representation
    (the paper feeds them a shared representation mixed by a gate of their own). LibMTL cuts only ResNets; here any
    backbone with stages. LibMTL measures the gates' input widths by a training-mode forward of a random sample
    (which moves the first shared expert's BatchNorm statistics); here an evaluation-mode forward of zeros.

    Shared parameters: the shared experts' (LibMTL's `get_share_params`). Shared representation: the tasks' last
    representations stacked (T, N, ...), each read by its own task only, so methods at `shared_rep` are refused.
    Measurements: `arch/gate/<task>/level<i>/shared<e>` and `.../own<e>`, each task's mean gate weights.
    """

    shared_rep_is_per_task = True

    def __init__(self, backbone: Backbone, num_shared: int = 1, num_specific: int = 1) -> None:
        """
        backbone: the backbone's trunk and stages (given by the model).
        num_shared: experts shared by all tasks at each level (LibMTL's `num_experts[0]`).
        num_specific: experts of each task's own at each level (LibMTL's `num_experts[1:]`, the same for every task).
        """
        super().__init__()
        self.tasks = list(backbone.tasks)
        self.num_shared = check_count("num_shared", num_shared)
        self.num_specific = check_count("num_specific", num_specific, minimum=0)
        shared = backbone.fresh(num_shared)
        own = {t: backbone.fresh(num_specific, reuse=False) for t in self.tasks}
        levels = len(backbone.levels(shared[0]))
        self.shared_layer = nn.ModuleDict(
            {str(i): nn.ModuleList(backbone.levels(trunk)[i] for trunk in shared) for i in range(levels)}
        )
        self.specific_layer = nn.ModuleDict(
            {
                str(i): nn.ModuleDict(
                    {t: nn.ModuleList(backbone.levels(trunk)[i] for trunk in own[t]) for t in self.tasks}
                )
                for i in range(levels)
            }
        )
        sizes = _input_sizes(backbone, shared[0])
        width = num_shared + num_specific
        self.gate_specific = nn.ModuleDict(
            {
                t: nn.ModuleList(nn.Sequential(nn.Linear(sizes[i], width), nn.Softmax(dim=-1)) for i in range(levels))
                for t in self.tasks
            }
        )
        self._set_last_layers([backbone.last_layer(trunk) for trunk in shared])
        self.expert_names = [f"shared{e}" for e in range(num_shared)] + [f"own{e}" for e in range(num_specific)]

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        return self.shared_layer.parameters()

    def forward(self, x: Tensor, tasks: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
        reps = {}
        for task in tasks:
            rep = x
            gates = typing.cast(nn.ModuleList, self.gate_specific[task])
            for i, gate in enumerate(gates):
                shared = typing.cast(nn.ModuleList, self.shared_layer[str(i)])
                own = typing.cast(nn.ModuleList, typing.cast(nn.ModuleDict, self.specific_layer[str(i)])[task])
                experts = torch.stack([e(rep) for e in [*shared, *own]])
                weights = gate(torch.flatten(rep, start_dim=1))
                self._measure_gate(f"{task}/level{i}", weights, self.expert_names)
                rep = mix(experts, weights)
            reps[task] = rep
        stacked = torch.stack([reps[t] for t in tasks])  # the heads read its slices: it is on every loss's path
        return stacked, {t: stacked[i] for i, t in enumerate(tasks)}

    def extra_repr(self) -> str:
        return f"num_shared={self.num_shared}, num_specific={self.num_specific}"


def _input_sizes(backbone: Backbone, trunk: nn.Sequential) -> list[int]:
    """Features of one sample entering each level (the gates' input widths)."""
    was_training = trunk.training
    trunk.eval()
    sizes = []
    with torch.no_grad():
        h = torch.zeros(1, *backbone.input_shape)
        for level in backbone.levels(trunk):
            sizes.append(math.prod(h.shape[1:]))
            h = level(h)
    trunk.train(was_training)
    return sizes
