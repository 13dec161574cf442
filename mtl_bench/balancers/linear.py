"""Linear scalarization with a preference drawn each step, as Pareto HyperNetworks train (Navon et al., ICLR 2021;
AvivNavon/pareto-hypernetworks phn/solvers.py `LinearScalarizationSolver`)."""

from __future__ import annotations

from typing import Sequence

from torch import Tensor

from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.preference import Concentration, Preference, PreferenceOption
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.balancer import task_list
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer, objective_weights


class LinearScalarizationWeighting(LossWeighting):
    """Trains on Σ_i r_i L_i with the preference r fixed by config or, with `preference: dirichlet`, drawn from
    Dir(alpha) each optimizer step (uniform on the simplex when `alpha` is null): the objective of a
    preference-conditioned model (`model/front=...`) that sees the same r. With a fixed r it is `balancer=fixed`
    with weights r. No per-task mode (the preference scalarizations' draw is shared by the step's tasks).

    Reference: PHN's `LinearScalarizationSolver`, `(losses * ray).sum()`, with a ray ~ Dir(alpha) per batch.

    Metrics: `weight/<task>` (r_i); with `dirichlet`, `preference/<task>`.
    """

    step_mean = False  # the draw is no statistic of the losses: each micro-batch is weighted by its own

    def __init__(self, preference: Preference) -> None:
        """
        preference: r (fixed, or drawn each step by `update`).
        """
        super().__init__()
        self.preference = preference

    @property
    def stateful(self) -> bool:
        return self.preference.draws

    def forward(self, losses: Tensor) -> Solution:
        weights = objective_weights(lambda at: (self.preference.pref * at).sum(), losses)
        return Solution(weights, metrics=self.preference.metrics())

    def update(self, losses: Tensor, items: Tensor) -> dict[str, Tensor]:
        return {f"preference.{name}": value for name, value in self.preference.next().items()}


class LinearScalarization(LossWeightingBalancer):
    """The linear scalarization (`LinearScalarizationWeighting`) as a balancer: `balancer=linear`."""

    def __init__(
        self,
        task_names: Sequence[str],
        preference: PreferenceOption = None,
        alpha: Concentration = None,
        seed: int = 0,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        preference: r, one weight >= 0 per task; None gives 1/T each; `dirichlet` draws r each step.
        alpha: with `dirichlet`, the concentration: a number > 0 or one per task; None gives 1 (uniform).
        seed: with `dirichlet`, the seed of the balancer's own generator (the run's seed in the config).
        """
        names = sorted(task_list(type(self), task_names))
        super().__init__(names, LinearScalarizationWeighting(Preference(names, preference, alpha, seed)))
