"""Zhang & Li, IEEE TEVC 2007, "MOEA/D: A Multiobjective Evolutionary Algorithm Based on Decomposition" (PBI)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.scalarization import ScalarizedBalancer, preference_vector, reference_point

EPSILON = 1e-12  # under d2's square root, so its gradient stays finite on the preference line (torchjd's)


class PenaltyBoundaryIntersection(ScalarizedBalancer):
    """Penalty-based boundary intersection: with f = L − z and the unit preference direction ŵ, trains on
    d1 + θ·d2, d1 = f·ŵ (progress along ŵ) and d2 = ‖f − d1 ŵ‖ (distance from the preference line).

    Reference: torchjd 0.18 `scalarization.PBI` (ε = 1e-12 under the root). No per-task mode: d2 needs every
    loss.

    Metrics: `weight/<task>` (∂f/∂L_i).
    """

    pref: Tensor
    reference_point: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        theta: float = 5.0,
        preference: Optional[Mapping[str, float]] = None,
        reference: Optional[Mapping[str, float]] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        theta: the penalty θ on d2 (>= 0; the MOEA/D paper uses 5).
        preference: the direction w, one weight >= 0 per task; None gives 1/T each.
        reference: the ideal point z, one number per task; None gives 0 each.
        """
        super().__init__(list(task_names))
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta >= 0:
            raise ValueError(f"theta: must be a number >= 0, got {theta!r}")
        self.theta = float(theta)
        self.register_buffer("pref", preference_vector(preference, self.task_names))
        self.register_buffer("reference_point", reference_point(reference, self.task_names))

    def extra_repr(self) -> str:
        return f"tasks={self.task_names}, theta={self.theta}"

    def _objective(self, losses: Tensor) -> Tensor:
        f = losses - self.reference_point
        direction = self.pref / self.pref.norm()
        d1 = f @ direction
        perpendicular = f - d1 * direction
        return d1 + self.theta * torch.sqrt(perpendicular @ perpendicular + EPSILON)
