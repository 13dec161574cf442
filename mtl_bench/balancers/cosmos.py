"""Ruchte & Grabocka, ICDM 2021, "Scalable Pareto Front Approximation for Deep Multi-Objective Learning" (COSMOS)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch.nn.functional as F
from torch import Tensor

from mtl_bench.balancers.scalarization import ScalarizedBalancer, preference_vector


class COSMOS(ScalarizedBalancer):
    """Trains on Σ_i r_i L_i − λ·cos(r, L): the linear scalarization with preference r, minus a reward for
    the loss vector pointing along r (λ = 0 is the plain weighted sum). A weight can be negative.

    Reference: torchjd 0.18 `scalarization.COSMOS`. As torchjd, this is the objective only: the paper also
    feeds r to the model and draws a new r from a Dirichlet each step to learn the whole front; here r is
    fixed by config (one trade-off per run). No per-task mode: cos(r, L) needs every loss.

    Metrics: `weight/<task>` (∂f/∂L_i).
    """

    pref: Tensor

    def __init__(
        self, task_names: Sequence[str], lambda_: float = 1.0, preference: Optional[Mapping[str, float]] = None
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        lambda_: the cosine penalty λ (>= 0; the paper uses 0.01 to 8 by data set).
        preference: r, one weight >= 0 per task; None gives 1/T each.
        """
        super().__init__(list(task_names))
        if isinstance(lambda_, bool) or not isinstance(lambda_, (int, float)) or not lambda_ >= 0:
            raise ValueError(f"lambda_: must be a number >= 0, got {lambda_!r}")
        self.lambda_ = float(lambda_)
        self.register_buffer("pref", preference_vector(preference, self.task_names))

    def extra_repr(self) -> str:
        return f"tasks={self.task_names}, lambda_={self.lambda_}"

    def _objective(self, losses: Tensor) -> Tensor:
        return (self.pref * losses).sum() - self.lambda_ * F.cosine_similarity(self.pref, losses, dim=0)
