"""Ruchte & Grabocka, ICDM 2021, "Scalable Pareto Front Approximation for Deep Multi-Objective Learning" (COSMOS)."""

from __future__ import annotations

from typing import Sequence

import torch.nn.functional as F
from torch import Tensor

from mtl_bench.balancers.checks import number
from mtl_bench.balancers.preference import Concentration, Preference, PreferenceScalarization


class COSMOS(PreferenceScalarization):
    """Trains on Σ_i r_i L_i − λ·cos(r, L): the linear scalarization with preference r, minus a reward for
    the loss vector pointing along r (λ = 0 is the plain weighted sum). A weight can be negative.

    r is fixed by config (one trade-off per run) or, with `preference: dirichlet`, drawn from Dir(alpha) each
    optimizer step as the paper trains (its code's default concentration, 1.2, when `alpha` is null; see
    PreferenceScalarization). The paper also feeds r to the network (concatenated to the input) so that one
    model answers every r: that is `model/front=cosmos`, which sees the r drawn here each step (docs/pareto_front.md);
    with another model the run trains one network across the front, not conditioned on r.

    Reference: torchjd 0.18 `scalarization.COSMOS` (the objective for a given r; its docstring asks for a
    Dirichlet draw before every call to learn the front). No per-task mode: cos(r, L) needs every loss.

    Metrics: `weight/<task>` (∂f/∂L_i); with `dirichlet`, `preference/<task>` (the step's r_i).
    """

    DEFAULT_ALPHA = 1.2  # ruchtem/cosmos multi_objective/settings.py, `cosmos` (Multi-MNIST)

    def __init__(
        self,
        task_names: Sequence[str],
        lambda_: float = 1.0,
        preference: Preference = None,
        alpha: Concentration = None,
        seed: int = 0,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        lambda_: the cosine penalty λ (>= 0; the paper uses 0.01 to 8 by data set).
        preference: r, one weight >= 0 per task; None gives 1/T each; `dirichlet` draws r each step.
        alpha: with `dirichlet`, the concentration: a number > 0 or one per task; None gives 1.2 (the paper's).
        seed: with `dirichlet`, the seed of the balancer's own generator (the run's seed in the config).
        """
        super().__init__(task_names, preference, alpha, seed)
        number("lambda_", lambda_, 0)
        self.lambda_ = float(lambda_)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lambda_={self.lambda_}"

    def _objective(self, losses: Tensor) -> Tensor:
        return (self.pref * losses).sum() - self.lambda_ * F.cosine_similarity(self.pref, losses, dim=0)
