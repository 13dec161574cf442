"""Lin et al., ICML 2024, "Smooth Tchebycheff Scalarization for Multi-Objective Optimization" (STCH)."""

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


class SmoothTchebycheffWeighting(LossWeighting):
    """Trains on μ·log Σ_i exp(λ_i (f_i − z_i) / μ), a smooth maximum of the weighted objectives λ_i (f_i − z_i)
    (tighter as μ → 0): w = ∂/∂L, so the worst-off task gets most of the weight. Without warm-up f_i = L_i.

    With `warmup_steps` = S > 0 (LibMTL main's variant): the first S steps train on Σ_i log(L_i + 1e-20) (the
    scale-invariant loss), the losses of the last `nadir_steps` of them average into the nadir point n, and from
    then on f_i = log(L_i / n_i + 1e-20) and the objective is multiplied by T, as LibMTL does (so the update keeps
    the scale of the warm-up's sum over T tasks).

    Reference: torchjd 0.18 `scalarization.STCH` (no warm-up; preference 1/T by default) and LibMTL main
    `STCH` (commit 4336804): its `STCH_warmup_epoch` W is warmup_steps = (W + 1)·E and nadir_steps = E for E
    steps per epoch, with preference 1 each. The step count and the nadir sum are buffers, advanced by `update` once
    per optimizer step from the step's losses (under accumulation the weights use the step's mean so far, as the nadir
    point does). No per-task mode.

    With `preference: dirichlet` (no warm-up) λ is drawn from Dir(alpha) each optimizer step, as for COSMOS and PBI
    (`Preference`), so a preference-conditioned model (`model/front=...`) learns the STCH front.

    Metrics: `weight/<task>` (w_i); with `dirichlet`, `preference/<task>`.
    """

    reference_point: Tensor
    steps: Tensor
    nadir_sum: Tensor

    def __init__(
        self,
        preference: Preference,
        mu: float,
        reference: Optional[Mapping[str, float]],
        warmup_steps: int,
        nadir_steps: Optional[int],
    ) -> None:
        """
        preference: λ (fixed, or drawn each step by `update`; fixed with a warm-up).
        mu, reference, warmup_steps, nadir_steps: the balancer's options (`SmoothTchebycheff`).
        """
        super().__init__()
        if preference.draws and warmup_steps:
            raise ValueError("warmup_steps: the warm-up's nadir point needs a fixed preference, not dirichlet; set 0")
        self.preference = preference
        self.mu = number("mu", mu, 0, above=True)
        self.warmup_steps = number("warmup_steps", warmup_steps, 0, integer=True)
        if nadir_steps is not None and warmup_steps == 0:
            raise ValueError("nadir_steps: only with warmup_steps > 0 (no warm-up, no nadir point)")
        self.nadir_steps = warmup_steps if nadir_steps is None else nadir_steps
        if warmup_steps:
            number("nadir_steps", self.nadir_steps, 1, warmup_steps, integer=True, note="(at most warmup_steps)")
        self.register_buffer("reference_point", reference_point(reference, preference.task_names))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.register_buffer("nadir_sum", torch.zeros(len(preference.task_names)))
        # the warm-up's state is a statistic of the losses (the step's mean); a draw is not
        self.step_mean = bool(self.warmup_steps)

    def extra_repr(self) -> str:
        return f"mu={self.mu}"

    @property
    def stateful(self) -> bool:
        return self.preference.draws or bool(self.warmup_steps)

    def objective(self, losses: Tensor) -> Tensor:
        pref = self.preference.pref
        if self.warmup_steps:
            logs = torch.log(losses / (self.nadir_sum / self.nadir_steps) + 1e-20)
            return len(pref) * self.mu * torch.logsumexp(pref * (logs - self.reference_point) / self.mu, 0)
        return self.mu * torch.logsumexp(pref * (losses - self.reference_point) / self.mu, dim=0)

    def forward(self, losses: Tensor) -> Solution:
        weights = objective_weights(self.objective, losses)
        if self.warmup_steps:  # warm-up: ∂ Σ log(L + 1e-20) / ∂L; after it the STCH weights on the committed nadir
            weights = torch.where(self.steps < self.warmup_steps, 1 / (losses + 1e-20), weights)
        return Solution(weights, metrics=self.preference.metrics())

    def update(self, losses: Tensor, items: Tensor) -> dict[str, Tensor]:
        state = {f"preference.{name}": value for name, value in self.preference.next().items()}
        if not self.warmup_steps:
            return state
        nadir = (self.steps < self.warmup_steps) & (self.steps >= self.warmup_steps - self.nadir_steps)
        nadir_sum = torch.where(nadir, self.nadir_sum + losses, self.nadir_sum)
        return state | {"steps": self.steps + 1, "nadir_sum": nadir_sum}


class SmoothTchebycheff(LossWeightingBalancer):
    """STCH (`SmoothTchebycheffWeighting`) as a balancer: `balancer=stch`."""

    def __init__(
        self,
        task_names: Sequence[str],
        mu: float = 0.1,
        preference: PreferenceOption = None,
        reference: Optional[Mapping[str, float]] = None,
        warmup_steps: int = 0,
        nadir_steps: Optional[int] = None,
        alpha: Concentration = None,
        seed: int = 0,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        mu: the smoothing μ (> 0); smaller is closer to the maximum (the paper tries 0.01 to 1).
        preference: λ, one weight >= 0 per task; None gives 1/T each; `dirichlet` draws λ each step (warmup_steps 0).
        reference: the ideal point z, one number per task; None gives 0 each.
        warmup_steps: steps on Σ log L_i before the STCH objective on log(L_i / nadir_i) (0: none, f_i = L_i).
        nadir_steps: the last warm-up steps whose losses average into the nadir point (1..warmup_steps); null:
            all of them. Only with warmup_steps > 0.
        alpha: with `dirichlet`, the concentration: a number > 0 or one per task; None gives 1 (uniform).
        seed: with `dirichlet`, the seed of the balancer's own generator (the run's seed in the config).
        """
        names = sorted(task_list(type(self), task_names))
        r = Preference(names, preference, alpha, seed)
        super().__init__(names, SmoothTchebycheffWeighting(r, mu, reference, warmup_steps, nadir_steps))
