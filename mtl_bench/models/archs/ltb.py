"""Learning to branch (Guo et al., ICML 2020; LibMTL main branch at 4336804, architecture/LTB.py)."""

from __future__ import annotations

import math
import typing
from typing import Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtl_bench.models.archs.base import Architecture, Backbone


class LTB(Architecture):
    """One column per task, each a copy of the trunk cut into levels (the stem, if any, then each stage); before
    level i >= 1, task t's column reads sum_j a[i, t, j] h_j (h_j: column j's level i - 1), where a[i, t] is a hard
    Gumbel-softmax sample (straight-through) of the learned branching logits `alpha[i, t]` at temperature
    tau = epochs / 20 / sqrt(epoch + 1); during the first epochs / 100 epochs (warm-up) every a is 1, in training
    and in evaluation.

    As LibMTL's: `alpha` has (levels + 1, T, T) entries, initialised to ones, of which rows 1 .. levels - 1 are used
    (LibMTL: 6 rows for ResNets' 5 levels); the warm-up sums the columns. Difference, following the paper: after
    the warm-up, evaluation takes each task's most likely parent (LibMTL samples in evaluation as well, so its
    test numbers vary run to run). The training progress comes from the engine (`set_progress(epoch, epochs)`,
    LibMTL's trainer sets `epoch` and `epochs` on the model); a training forward before it raises.

    Shared parameters: every column and `alpha` (LibMTL's: the whole encoder). Shared representation: the columns'
    last outputs stacked (T, N, ...), each read by its own task only, so methods at `shared_rep` are refused.
    Measurements: the branching probabilities softmax(alpha[i, t]), `arch/branch<i>/<task>/<parent task>`.
    """

    shared_rep_is_per_task = True

    def __init__(self, backbone: Backbone) -> None:
        """
        backbone: the backbone's trunk and stages (given by the model); two levels or more.
        """
        super().__init__()
        self.tasks = list(backbone.tasks)
        n = len(self.tasks)
        trunks = backbone.fresh(n)
        self.columns = nn.ModuleList(nn.ModuleList(backbone.levels(trunk)) for trunk in trunks)
        levels = len(backbone.levels(trunks[0]))
        if levels < 2:
            raise ValueError(f"backbone: ltb needs two levels or more, got {levels}")
        self.alpha = nn.Parameter(torch.ones(levels + 1, n, n))
        self.epoch: Optional[int] = None
        self.epochs: Optional[int] = None
        self._set_last_layers([backbone.last_layer(trunk) for trunk in trunks])

    def set_progress(self, epoch: int, epochs: int) -> None:
        """The epoch about to be trained (from 0) and the number of epochs: the warm-up and the temperature."""
        self.epoch, self.epochs = int(epoch), int(epochs)

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        return self.parameters()

    def warming_up(self) -> bool:
        """In the warm-up (the first epochs / 100 epochs: a run of one epoch or less never leaves it), or before any
        progress was given (an evaluation before the first step: the network the first steps train)."""
        return self.epoch is None or self.epochs is None or self.epoch < self.epochs / 100

    def branching(self) -> Tensor:
        """The mixing weights a (levels + 1, T, T) of this forward. The warm-up's sum of every column is the network
        that training and evaluation both use then (alpha gets no gradient in the warm-up: its argmax would pick
        column 0 for every task, a network never trained); after it, evaluation takes each task's most likely
        parent."""
        if self.training and (self.epoch is None or self.epochs is None):
            raise RuntimeError("LTB: training needs the progress first: model.set_progress(epoch, epochs)")
        if self.warming_up():
            return torch.ones_like(self.alpha)
        assert self.epoch is not None and self.epochs is not None  # warming_up() otherwise
        if not self.training:
            return F.one_hot(self.alpha.argmax(-1), len(self.tasks)).to(self.alpha.dtype)
        tau = self.epochs / 20 / math.sqrt(self.epoch + 1)
        return F.gumbel_softmax(self.alpha, dim=-1, tau=tau, hard=True)

    def forward(self, x: Tensor, tasks: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
        a = self.branching()
        columns = typing.cast("list[nn.ModuleList]", list(self.columns))
        outs = [column[0](x) for column in columns]
        for i in range(1, len(columns[0])):
            stacked = torch.stack(outs)
            mixed = torch.einsum("tj, j... -> t...", a[i], stacked)
            outs = [column[i](mixed[t]) for t, column in enumerate(columns)]
        if self.training and torch.is_grad_enabled():
            probabilities = torch.softmax(self.alpha.detach(), dim=-1)
            for i in range(1, len(columns[0])):
                for t, task in enumerate(self.tasks):
                    row = probabilities[i, t].unbind()
                    self._measured.update({f"arch/branch{i}/{task}/{j}": v for j, v in zip(self.tasks, row)})
        shared = torch.stack(outs)
        return shared, {task: shared[self.tasks.index(task)] for task in tasks}

    def extra_repr(self) -> str:
        return f"tasks={self.tasks}, epoch={self.epoch}, epochs={self.epochs}"
