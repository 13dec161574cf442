"""ReduceLROnPlateau on a validation criterion, stepped at each evaluation (Nash-MTL's and FAMO's QM9 schedule:
ReduceLROnPlateau(optimizer, "min", factor=0.7, patience=5, min_lr=1e-5) stepped with the epoch's validation Δm).

torch's own `ReduceLROnPlateau` does the bookkeeping; this class gives it the engine's schedule protocol: `step()`
after each optimizer step changes nothing, `validation_step(cost)` after each evaluation on val is torch's
`step(metric)`, and `criterion` names what the engine measures (as `select.criterion`: delta_m, a metric's
mean over tasks, or <task>/<metric>; always as a cost, lower is better).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau


class Plateau:
    """Multiply the lr by `factor` after `patience` evaluations without improvement of `criterion` on val."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        criterion: str = "delta_m",
        factor: float = 0.7,
        patience: int = 5,
        min_lr: float = 1e-5,
        threshold: float = 1e-4,
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        criterion: what is measured on val at each evaluation: delta_m (needs tasks.reference), a metric (its mean
            over tasks) or <task>/<metric>; lower-is-better is applied from the metric's direction.
        factor: the lr's factor at each reduction, in (0, 1).
        patience: evaluations without improvement before a reduction (>= 0).
        min_lr: the lr never goes below this (>= 0).
        threshold: torch's relative improvement threshold (>= 0).
        """
        if not 0 < factor < 1:
            raise ValueError(f"factor: must be in (0, 1), got {factor}")
        if patience < 0 or min_lr < 0 or threshold < 0:
            raise ValueError(f"patience: must be >= 0 (and min_lr, threshold >= 0), got {patience}")
        self.criterion = criterion
        self.torch = ReduceLROnPlateau(
            optimizer, mode="min", factor=factor, patience=patience, min_lr=min_lr, threshold=threshold
        )

    def step(self) -> None:
        """After each optimizer step: the lr changes at evaluations only."""

    def validation_step(self, cost: float) -> None:
        self.torch.step(cost)

    def state_dict(self) -> dict[str, Any]:
        return self.torch.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.torch.load_state_dict(state)
