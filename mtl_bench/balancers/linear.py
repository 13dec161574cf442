"""Linear scalarization with a preference drawn each step, as Pareto HyperNetworks train (Navon et al., ICLR 2021;
AvivNavon/pareto-hypernetworks phn/solvers.py `LinearScalarizationSolver`)."""

from __future__ import annotations

from typing import Sequence

from torch import Tensor

from mtl_bench.balancers.preference import Concentration, Preference, PreferenceScalarization


class LinearScalarization(PreferenceScalarization):
    """Trains on Σ_i r_i L_i with the preference r fixed by config or, with `preference: dirichlet`, drawn from
    Dir(alpha) each optimizer step (uniform on the simplex when `alpha` is null): the objective of a
    preference-conditioned model (`model/front=...`) that sees the same r. With a fixed r it is `balancer=fixed`
    with weights r. No per-task mode (the preference scalarizations' draw is shared by the step's tasks).

    Reference: PHN's `LinearScalarizationSolver`, `(losses * ray).sum()`, with a ray ~ Dir(alpha) per batch.

    Metrics: `weight/<task>` (r_i); with `dirichlet`, `preference/<task>`.
    """

    def __init__(
        self, task_names: Sequence[str], preference: Preference = None, alpha: Concentration = None, seed: int = 0
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        preference: r, one weight >= 0 per task; None gives 1/T each; `dirichlet` draws r each step.
        alpha: with `dirichlet`, the concentration: a number > 0 or one per task; None gives 1 (uniform).
        seed: with `dirichlet`, the seed of the balancer's own generator (the run's seed in the config).
        """
        super().__init__(task_names, preference, alpha, seed)

    def _objective(self, losses: Tensor) -> Tensor:
        return (self.pref * losses).sum()
