"""Cross-stitch networks (Misra et al., CVPR 2016; LibMTL 1.1.5 architecture/Cross_stitch.py)."""

from __future__ import annotations

import typing
from typing import Iterator, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.archs.base import Architecture, Backbone

MIXINGS = ("paper", "libmtl")


class CrossStitch(Architecture):
    """One column per task, each a copy of the trunk cut into the backbone's stages; between consecutive stages a
    cross-stitch unit mixes the columns' outputs: the input of column t's next stage is sum_j a[s, t, j] x_j.

    mixing=paper: a (T, T) matrix per stitch, a[t, t] = `self_weight`, the rest (1 - self_weight) / (T - 1) (the
    paper's initialisation, 0.9 / 0.1 for two tasks). mixing=libmtl: LibMTL's unit, one vector per stitch shared by
    every column (all columns read the same mixture, a[s, t, j] = a[s, j]), initialised to ones; LibMTL allocates
    one vector per stage and uses all but the last, kept here so parameter counts match. LibMTL cuts only ResNets
    (stem + layer1 | layer2 | layer3 | layer4); here any backbone with stages.

    As LibMTL, every column and unit is shared (`get_share_params`: the whole encoder): each task's loss depends on
    all of them. The shared representation is the columns' last outputs stacked (T, N, ...); task t's loss reads its
    own slice only, so per-task gradients there are zero outside their slice (LibMTL's `rep_grad` keeps the T
    tensors apart and treats them as one space): methods comparing gradients at `shared_rep` are refused.
    Measurements: the units' coefficients, `arch/stitch<s>/<task>/<task j>` (libmtl: `arch/stitch<s>/<task j>`).
    """

    shared_rep_is_per_task = True

    def __init__(self, backbone: Backbone, mixing: str = "paper", self_weight: float = 0.9) -> None:
        """
        backbone: the backbone's trunk and stages (given by the model); at least 2 stages.
        mixing: paper (a T x T unit per stitch) or libmtl (LibMTL's one vector per stitch, shared by the columns).
        self_weight: mixing=paper's initial weight of a column's own stage output, in [0, 1] (the rest split evenly).
        """
        super().__init__()
        if mixing not in MIXINGS:
            raise ValueError(f"mixing: {mixing!r} is not one of {', '.join(MIXINGS)}")
        if isinstance(self_weight, bool) or not 0 <= self_weight <= 1:
            raise ValueError(f"self_weight: must be in [0, 1], got {self_weight!r}")
        if len(backbone.stages) < 2:
            raise ValueError(f"backbone: cross-stitch needs a backbone with 2 or more stages, got {backbone.stages}")
        self.tasks, self.mixing, self.self_weight = list(backbone.tasks), mixing, float(self_weight)
        n, stitches = len(self.tasks), len(backbone.stages) - 1
        trunks = backbone.fresh(n)
        self.columns = nn.ModuleList(nn.ModuleList(backbone.cut(trunk)) for trunk in trunks)
        if mixing == "libmtl":
            self.cross_unit = nn.Parameter(torch.ones(stitches + 1, n))
        else:
            other = (1 - self.self_weight) / (n - 1) if n > 1 else 0.0
            unit = torch.full((n, n), other).fill_diagonal_(self.self_weight)
            self.cross_unit = nn.Parameter(unit.expand(stitches, n, n).clone())
        self._set_last_layers([backbone.last_layer(trunk) for trunk in trunks])

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        return self.parameters()

    def units(self) -> Tensor:
        """The (stitches, T, T) mixing matrices."""
        if self.mixing == "libmtl":
            n = len(self.tasks)
            return self.cross_unit[:-1].unsqueeze(1).expand(-1, n, -1)
        return self.cross_unit

    def forward(self, x: Tensor, tasks: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
        units = self.units()
        columns = typing.cast("list[nn.ModuleList]", list(self.columns))
        outs = [column[0](x) for column in columns]
        for s in range(1, len(columns[0])):
            stacked = torch.stack(outs)  # (T, N, ...)
            mixed = torch.einsum("tj, j... -> t...", units[s - 1], stacked)
            outs = [column[s](mixed[t]) for t, column in enumerate(columns)]
        if self.training and torch.is_grad_enabled():
            self._measure_units()
        shared = torch.stack(outs)
        return shared, {task: shared[self.tasks.index(task)] for task in tasks}

    def _measure_units(self) -> None:
        # a copy: the parameter changes in place at the optimizer step, and the loop reads these values later, as
        # the other architectures' measurements, the values this forward used
        coefficients = self.cross_unit.detach().clone()
        for s, row in enumerate(coefficients[:-1] if self.mixing == "libmtl" else coefficients):
            if self.mixing == "libmtl":
                self._measured.update({f"arch/stitch{s}/{j}": v for j, v in zip(self.tasks, row.unbind())})
            else:
                for t, task in enumerate(self.tasks):
                    self._measured.update({f"arch/stitch{s}/{task}/{j}": v for j, v in zip(self.tasks, row[t])})

    def extra_repr(self) -> str:
        return f"tasks={self.tasks}, mixing={self.mixing}, self_weight={self.self_weight}"
