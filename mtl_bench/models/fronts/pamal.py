"""Pareto Manifold Learning (Dimitriadis et al., ICLR 2023): weight ensembles mixed by the preference; as
nik-dim/pamal 26adf53 src/ll/weight_ensemble.py `SimplexWeightEnsemble` and src/ll/subspace_modules.py."""

from __future__ import annotations

from typing import Iterator, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.base import ModelOutput, MultiTaskModel
from mtl_bench.models.fronts.base import ModelFactory, PreferenceModel


class PaMaL(PreferenceModel):
    """T members (one per task: PaMaL's one-hot `task_weights_list`), each a whole model (trunk and heads)
    initialised independently (its `reinit_flag: true`); the network answering r has every parameter
    θ(r) = Σ_k r_k θ_k, the members' parameters mixed by the preference, as its SubspaceConv, SubspaceLinear and
    SubspaceBatchNorm2d do for their weights and biases. Buffers (BatchNorm's running statistics) are the first
    member's, one set for the ensemble as its SubspaceBatchNorm2d keeps.

    Differences from the reference: every parameter is mixed (PaMaL's code mixes those of Conv2d, Linear and
    BatchNorm2d layers only, the layers its models have); one r per optimizer step (its trainer can forward a
    window of several r per batch, `num: 4`, with a regulariser whose coefficient its configs set to 0).
    """

    def __init__(self, model: ModelFactory, input_shape: Sequence[int], heads: Mapping[str, int]) -> None:
        """
        model: the members' factory (given by the engine: the `model` option with its architecture).
        input_shape: one sample's shape (given by the engine from the task set).
        heads: each task's output width (given by the engine from the task set).
        """
        super().__init__(list(heads))
        self.members = nn.ModuleList(model(input_shape=input_shape, heads=heads) for _ in heads)
        # The first member's structure runs every forward, with the mixed parameters (kept outside the module
        # registry: it is already registered as members.0).
        self.__dict__["model"] = self.members[0]
        self.names = [name for name, _ in self.inner.named_parameters()]

    def _each(self, pick: str, *args: str) -> Iterator[nn.Parameter]:
        for member in self.members:
            yield from getattr(member, pick)(*args)

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        return self._each("shared_parameters")

    def task_parameters(self, task: str) -> Iterator[nn.Parameter]:
        return self._each("task_parameters", task)

    def mixed(self, preference: Tensor) -> dict[str, Tensor]:
        """θ(r) by parameter name of the first member."""
        params = [dict(m.named_parameters()) for m in self.members]
        weights = preference.unbind()
        mixed = {}
        for name in self.names:  # in PaMaL's order: sum([member_i.weight * alpha[i] for i ...])
            total = params[0][name] * weights[0]
            for p, r in zip(params[1:], weights[1:]):
                total = total + p[name] * r
            mixed[name] = total
        return mixed

    def forward(self, x: Tensor, tasks: Optional[Sequence[str]] = None) -> ModelOutput:
        member: MultiTaskModel = self.inner
        return torch.func.functional_call(member, self.mixed(self.preference), (x,), {"tasks": tasks})
