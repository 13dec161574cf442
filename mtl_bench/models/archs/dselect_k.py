"""DSelect-k gates (Hazimeh et al., NeurIPS 2021; LibMTL 1.1.5 architecture/DSelect_k.py, after the official
TensorFlow code google-research/dselect_k_moe)."""

from __future__ import annotations

import math
import typing
from typing import Iterator, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.archs.base import Architecture, Backbone, check_count


def smooth_step(t: Tensor, gamma: float) -> Tensor:
    """0 below -gamma/2, 1 above gamma/2, the cubic -2/gamma^3 t^3 + 3/(2 gamma) t + 1/2 between (the paper's eq. 3)."""
    cubic = (-2 / gamma**3) * t**3 + (3 / (2 * gamma)) * t + 0.5
    return torch.where(t <= -gamma / 2, torch.zeros_like(t), torch.where(t >= gamma / 2, torch.ones_like(t), cubic))


class DSelectK(Architecture):
    """`num_experts` copies of the trunk (shared) and, per task, a DSelect-k gate: `num_nonzeros` binary-encoded
    selectors (smooth-step of a Linear on the flattened input) mixed by a softmax, so at most k experts get weight.

    During training forwards the selectors' entropy (times 1e-6) is minimised, plus sum 1/(selector mass) when the
    number of experts is not a power of 2 (codes past the last expert), by a backward at the gates' own parameters
    inside the forward, as LibMTL. Differences from LibMTL, which follow the paper and the official code: the
    smooth step uses `gamma` (LibMTL uses 1 there and `kgamma` only for the initialisation) and the regulariser
    covers every task's gate (LibMTL's covers the last task's only). Under AMP's loss scaling that backward is not
    scaled (its gradients are divided by the scale with the rest).
    Shared parameters: the experts'; shared representation: the experts' stacked outputs (see `MMoE`).
    Measurements: each task's mean weight per expert, `arch/gate/<task>/expert<e>`.
    """

    def __init__(self, backbone: Backbone, num_experts: int = 4, num_nonzeros: int = 2, gamma: float = 1.0) -> None:
        """
        backbone: the backbone's trunk and stages (given by the model).
        num_experts: experts shared by all tasks, each a copy of the trunk.
        num_nonzeros: k, the selectors per gate: at most k experts get nonzero weight (LibMTL's `num_nonzeros`).
        gamma: width of the smooth step's non-constant region, > 0 (LibMTL's `kgamma`).
        """
        super().__init__()
        self.tasks = list(backbone.tasks)
        self.num_experts = check_count("num_experts", num_experts, minimum=2)
        self.num_nonzeros = check_count("num_nonzeros", num_nonzeros)
        if isinstance(gamma, bool) or not gamma > 0:
            raise ValueError(f"gamma: must be > 0, got {gamma!r}")
        self.gamma = float(gamma)
        self.num_binary = math.ceil(math.log2(num_experts))
        self.power_of_2 = num_experts == 2**self.num_binary
        self.experts_shared = nn.ModuleList(backbone.fresh(num_experts))
        size = backbone.input_size
        self._z_logits = nn.ModuleDict({t: nn.Linear(size, num_nonzeros * self.num_binary) for t in self.tasks})
        self._w_logits = nn.ModuleDict({t: nn.Linear(size, num_nonzeros) for t in self.tasks})
        with torch.no_grad():  # the official code's initialisation
            for p in self._z_logits.parameters():
                p.uniform_(-self.gamma / 100, self.gamma / 100)
            for p in self._w_logits.parameters():
                p.uniform_(-0.05, 0.05)
        codes = [[(e >> (self.num_binary - 1 - b)) & 1 for b in range(self.num_binary)] for e in range(num_experts)]
        self.register_buffer("binary_codes", torch.tensor(codes, dtype=torch.bool), persistent=False)  # (E, bits)
        self._set_last_layers([backbone.last_layer(e) for e in self.experts_shared])
        self.expert_names = [f"expert{e}" for e in range(num_experts)]

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        return self.experts_shared.parameters()

    def gate(self, task: str, flat: Tensor) -> tuple[Tensor, Tensor]:
        """(expert weights (N, E), selector outputs (N, k, E)) of a task's gate."""
        logits = self._z_logits[task](flat).reshape(-1, self.num_nonzeros, 1, self.num_binary)
        steps = smooth_step(logits, self.gamma)
        codes = typing.cast(Tensor, self.binary_codes)
        selectors = torch.where(codes, steps, 1 - steps).prod(3)  # (N, k, E)
        mixture = torch.softmax(self._w_logits[task](flat), dim=1)  # (N, k)
        return torch.einsum("ij, ij... -> i...", mixture, selectors), selectors

    def forward(self, x: Tensor, tasks: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
        experts = torch.stack([e(x) for e in self.experts_shared])
        flat = torch.flatten(x, start_dim=1)
        reps: dict[str, Tensor] = {}
        regulariser: list[Tensor] = []
        for task in tasks:
            weights, selectors = self.gate(task, flat)
            self._measure_gate(task, weights, self.expert_names)
            reps[task] = torch.einsum("ij, ji... -> i...", weights, experts)
            regulariser.append(self._regulariser(selectors))
        if self.training and torch.is_grad_enabled() and regulariser:
            gates = [p for t in tasks for p in self._z_logits[t].parameters() if p.requires_grad]
            torch.autograd.backward(torch.stack(regulariser).sum(), inputs=gates, retain_graph=True)
        return experts, reps

    def _regulariser(self, selectors: Tensor) -> Tensor:
        loss = -(selectors * torch.log(selectors + 1e-6)).sum() * 1e-6
        if not self.power_of_2:
            loss = loss + (1 / selectors.sum(-1)).sum()
        return loss

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, num_nonzeros={self.num_nonzeros}, gamma={self.gamma}"
