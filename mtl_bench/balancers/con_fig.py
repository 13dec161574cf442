"""Liu, Chu & Thuerey, ICLR 2025, "ConFIG: Towards Conflict-free Training of Physics Informed Neural Networks"."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np
from torch import Tensor

from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer
from mtl_bench.gradient_engine.host import host_solution


def config_weights(gram: np.ndarray) -> tuple[np.ndarray, float]:
    """ConFIG's direction as weights on the raw gradients, from G alone, and cos(d, mean unit gradient).

    With the unit gradients U = D⁻¹J (D = diag ‖g_i‖; a zero gradient gives a zero row), the paper's
    direction is pinv(U)·1 = Uᵀ pinv(UUᵀ)·1 = Jᵀ D⁻¹ v with v = pinv(Ĝ)·1, Ĝ = D⁻¹GD⁻¹. Its unit vector
    û = Jᵀ D⁻¹ v / ‖Jᵀ D⁻¹ v‖ is scaled to Σ_i g_i·û, so the weights are (1ᵀ G D⁻¹ v) D⁻¹ v / (vᵀĜv).
    """
    norms = np.sqrt(np.clip(np.diag(gram), 0, None))
    inverse = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    unit_gram = gram * np.outer(inverse, inverse)
    v = np.linalg.pinv(unit_gram, hermitian=True) @ np.ones(len(norms))
    raw = inverse * v  # d = Jᵀ raw
    sq_norm = float(raw @ gram @ raw)
    if not sq_norm > 0:
        return np.zeros_like(raw), 0.0
    length = float(np.ones(len(norms)) @ gram @ raw) / np.sqrt(sq_norm)  # Σ_i g_i·û
    cosine = float(np.ones(len(norms)) @ unit_gram @ v) / np.sqrt(sq_norm) / np.sqrt(max(unit_gram.sum(), 1e-30))
    return raw * length / np.sqrt(sq_norm), cosine


class ConFIGWeighting(Weighting):
    """Conflict-free inverse gradients: the direction û that has the same cosine with every task gradient
    (û ∝ pinv(U)·1, U the unit gradients as rows), scaled to the sum of the gradients' projections on it,
    d = (Σ_i g_i·û) û. Computed from the Gramian (see `config_weights`): a T×T pseudo-inverse on the host.

    Reference: torchjd 0.18 `ConFIG` (default preference: 1 each), adapted there from the authors' code
    (tum-pbs/ConFIG); torchjd takes the pseudo-inverse of the T×P matrix of unit gradients in float32,
    here of their T×T Gramian in float64 (the same direction; they differ by rounding). The heads get their
    own gradients (weight 1), as torchjd's mtl_backward gives them.

    Metrics: `weight/<task>`, `grad_norm/<task>`, `grad_cos/<a>/<b>`, `con_fig/cos_mean` (the cosine of d with
    the sum of the unit gradients).
    """

    HOST_SOLVE = "a T×T pseudo-inverse (numpy)"

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        return host_solution(gram, "con_fig/cos_mean", config_weights)


class ConFIG(GramianBalancer):
    """ConFIG (`ConFIGWeighting`) as a balancer: `balancer=con_fig`; at the shared parameters, as its reference."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        The gradients are taken at the shared parameters only, as in the reference (no grad_source option).
        """
        super().__init__(task_names, shared_params, ConFIGWeighting())
