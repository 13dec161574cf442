"""Zhang & Li, IEEE TEVC 2007, "MOEA/D: A Multiobjective Evolutionary Algorithm Based on Decomposition" (PBI)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.checks import number
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.preference import Concentration, Preference, PreferenceOption
from mtl_bench.balancers.scalarization import reference_point
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.balancer import task_list
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer, objective_weights

EPSILON = 1e-12  # under d2's square root, so its gradient stays finite on the preference line (torchjd's)


class PenaltyBoundaryIntersectionWeighting(LossWeighting):
    """Penalty-based boundary intersection: with f = L − z and the unit preference direction ŵ, trains on
    d1 + θ·d2, d1 = f·ŵ (progress along ŵ) and d2 = ‖f − d1 ŵ‖ (distance from the preference line).

    The direction is fixed by config (one trade-off per run) or, with `preference: dirichlet`, drawn from
    Dir(alpha) each optimizer step to learn the whole front (uniform on the simplex, alpha = 1, when `alpha`
    is null, as torchjd's docstring draws it; see `Preference`). A preference-conditioned model
    (`model/front=<option>`) sees the direction drawn here each step, so one run learns the whole front.

    Reference: torchjd 0.18 `scalarization.PBI` (ε = 1e-12 under the root). No per-task mode: d2 needs every
    loss.

    Metrics: `weight/<task>` (∂f/∂L_i); with `dirichlet`, `preference/<task>` (the step's w_i).
    """

    step_mean = False  # the draw is no statistic of the losses: each micro-batch is weighted by its own
    reference_point: Tensor

    def __init__(self, preference: Preference, theta: float, reference: Optional[Mapping[str, float]]) -> None:
        """
        preference: the direction w (fixed, or drawn each step by `update`).
        theta: the penalty θ on d2 (>= 0).
        reference: the ideal point z, one number per task; None gives 0 each.
        """
        super().__init__()
        self.preference = preference
        self.theta = number("theta", theta, 0)
        self.register_buffer("reference_point", reference_point(reference, preference.task_names))

    def extra_repr(self) -> str:
        return f"theta={self.theta}"

    @property
    def stateful(self) -> bool:
        return self.preference.draws

    def objective(self, losses: Tensor) -> Tensor:
        f = losses - self.reference_point
        direction = self.preference.pref / self.preference.pref.norm()
        d1 = f @ direction
        perpendicular = f - d1 * direction
        return d1 + self.theta * torch.sqrt(perpendicular @ perpendicular + EPSILON)

    def forward(self, losses: Tensor) -> Solution:
        return Solution(objective_weights(self.objective, losses), metrics=self.preference.metrics())

    def update(self, losses: Tensor, items: Tensor) -> dict[str, Tensor]:
        return {f"preference.{name}": value for name, value in self.preference.next().items()}


class PenaltyBoundaryIntersection(LossWeightingBalancer):
    """PBI (`PenaltyBoundaryIntersectionWeighting`) as a balancer: `balancer=pbi`."""

    def __init__(
        self,
        task_names: Sequence[str],
        theta: float = 5.0,
        preference: PreferenceOption = None,
        reference: Optional[Mapping[str, float]] = None,
        alpha: Concentration = None,
        seed: int = 0,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        theta: the penalty θ on d2 (>= 0; the MOEA/D paper uses 5).
        preference: the direction w, one weight >= 0 per task; None gives 1/T each; `dirichlet` draws w each step.
        reference: the ideal point z, one number per task; None gives 0 each.
        alpha: with `dirichlet`, the concentration: a number > 0 or one per task; None gives 1 (uniform).
        seed: with `dirichlet`, the seed of the balancer's own generator (the run's seed in the config).
        """
        names = sorted(task_list(type(self), task_names))
        r = Preference(names, preference, alpha, seed)
        super().__init__(names, PenaltyBoundaryIntersectionWeighting(r, theta, reference))
