"""Lin et al., ICML 2024, "Smooth Tchebycheff Scalarization for Multi-Objective Optimization" (STCH)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.scalarization import ScalarizedBalancer, preference_vector, reference_point


class SmoothTchebycheff(ScalarizedBalancer):
    """Trains on μ·log Σ_i exp(λ_i (L_i − z_i) / μ), a smooth maximum of the weighted losses λ_i (L_i − z_i)
    (tighter as μ → 0): w = λ ⊙ softmax(λ ⊙ (L − z) / μ), so the worst-off task gets most of the weight.

    Reference: torchjd 0.18 `scalarization.STCH` (the paper's formula, preference 1/T by default). LibMTL
    main's `STCH` first trains `STCH_warmup_epoch` epochs on Σ log L_i and then applies the formula to
    log(L_i / nadir_i) with λ = 1, times T; that warm-up variant is not implemented here. No per-task mode.

    Metrics: `weight/<task>` (w_i).
    """

    pref: Tensor
    reference_point: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        mu: float = 0.1,
        preference: Optional[Mapping[str, float]] = None,
        reference: Optional[Mapping[str, float]] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        mu: the smoothing μ (> 0); smaller is closer to the maximum (the paper tries 0.01 to 1).
        preference: λ, one weight >= 0 per task; None gives 1/T each.
        reference: the ideal point z, one number per task; None gives 0 each.
        """
        super().__init__(list(task_names))
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not mu > 0:
            raise ValueError(f"mu: must be a number > 0, got {mu!r}")
        self.mu = float(mu)
        self.register_buffer("pref", preference_vector(preference, self.task_names))
        self.register_buffer("reference_point", reference_point(reference, self.task_names))

    def extra_repr(self) -> str:
        return f"tasks={self.task_names}, mu={self.mu}"

    def _objective(self, losses: Tensor) -> Tensor:
        return self.mu * torch.logsumexp(self.pref * (losses - self.reference_point) / self.mu, dim=0)
