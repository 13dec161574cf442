"""Ruchte & Grabocka, ICDM 2021, "Scalable Pareto Front Approximation for Deep Multi-Objective Learning" (COSMOS)."""

from __future__ import annotations

from typing import Sequence

import torch.nn.functional as F
from torch import Tensor

from mtl_bench.balancers.checks import number
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.preference import Concentration, Preference, PreferenceOption
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.balancer import task_list
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer, objective_weights

DEFAULT_ALPHA = 1.2  # ruchtem/cosmos multi_objective/settings.py, `cosmos` (Multi-MNIST)


class COSMOSWeighting(LossWeighting):
    """Trains on Σ_i r_i L_i − λ·cos(r, L): the linear scalarization with preference r, minus a reward for
    the loss vector pointing along r (λ = 0 is the plain weighted sum). A weight can be negative.

    r is fixed by config (one trade-off per run) or, with `preference: dirichlet`, drawn from Dir(alpha) each
    optimizer step as the paper trains (its code's default concentration, 1.2, when `alpha` is null; see
    `Preference`). The paper also feeds r to the network (concatenated to the input) so that one
    model answers every r: that is `model/front=cosmos`, which sees the r drawn here each step (docs/pareto_front.md);
    with another model the run trains one network across the front, not conditioned on r.

    Reference: torchjd 0.18 `scalarization.COSMOS` (the objective for a given r; its docstring asks for a
    Dirichlet draw before every call to learn the front). No per-task mode: cos(r, L) needs every loss.

    Metrics: `weight/<task>` (∂f/∂L_i); with `dirichlet`, `preference/<task>` (the step's r_i).
    """

    step_mean = False  # the draw is no statistic of the losses: each micro-batch is weighted by its own

    def __init__(self, preference: Preference, lambda_: float) -> None:
        """
        preference: r (fixed, or drawn each step by `update`).
        lambda_: the cosine penalty λ (>= 0).
        """
        super().__init__()
        self.preference = preference
        self.lambda_ = number("lambda_", lambda_, 0)

    def extra_repr(self) -> str:
        return f"lambda_={self.lambda_}"

    @property
    def stateful(self) -> bool:
        return self.preference.draws

    def objective(self, losses: Tensor) -> Tensor:
        pref = self.preference.pref
        return (pref * losses).sum() - self.lambda_ * F.cosine_similarity(pref, losses, dim=0)

    def forward(self, losses: Tensor) -> Solution:
        return Solution(objective_weights(self.objective, losses), metrics=self.preference.metrics())

    def update(self, losses: Tensor, items: Tensor) -> dict[str, Tensor]:
        return {f"preference.{name}": value for name, value in self.preference.next().items()}


class COSMOS(LossWeightingBalancer):
    """COSMOS (`COSMOSWeighting`) as a balancer: `balancer=cosmos`."""

    def __init__(
        self,
        task_names: Sequence[str],
        lambda_: float = 1.0,
        preference: PreferenceOption = None,
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
        names = sorted(task_list(type(self), task_names))
        r = Preference(names, preference, alpha, seed, DEFAULT_ALPHA)
        super().__init__(names, COSMOSWeighting(r, lambda_))
