"""Senushkin et al., CVPR 2023, "Independent Component Alignment for Multi-Task Learning" (Aligned-MTL)."""

from __future__ import annotations

from typing import Iterable, Literal, Optional, Sequence

import numpy as np
from torch import Tensor

from mtl_bench.balancers.checks import one_of
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer
from mtl_bench.gradient_engine.host import host_solution

SCALE_MODES = ("min", "median", "rmse")


def aligned_weights(gram: np.ndarray, scale_mode: str) -> tuple[np.ndarray, float]:
    """α = B·1 with B = √σ · V Λ^{-1/2} Vᵀ over the Gramian's eigenpairs (Λ, V) above the rank tolerance
    (max λ · T · float32 eps, as both references), σ the smallest (`min`), median or mean (`rmse`) kept
    eigenvalue; and the condition number √(λ_max/λ_min) of the gradient matrix."""
    t = gram.shape[0]
    lam, vec = np.linalg.eigh(gram)
    keep = lam > lam.max() * t * np.finfo(np.float32).eps
    if not keep.any():
        return np.ones(t), float("nan")
    lam, vec = lam[keep], vec[:, keep]
    sigma = {"min": lam.min(), "median": np.median(lam), "rmse": lam.mean()}[scale_mode]
    balance = np.sqrt(sigma) * (vec / np.sqrt(lam)) @ vec.T
    return balance.sum(0), float(np.sqrt(lam.max() / lam.min()))


class AlignedMTLWeighting(Weighting):
    """Aligns the task gradients' principal components: the gradient matrix's singular values are all set to
    the smallest one (or the median or mean, `scale_mode`), which makes the combined update stable whatever
    the gradients' magnitudes and conflicts; the aligned gradients are summed (equal preferences).

    In weight space: d = Σ_i α_i g_i with α = B·1 from the Gramian's eigen-decomposition (`aligned_weights`).
    `grad_source=shared_rep` aligns the gradients at the shared representation (the paper's cheaper
    variant), batch-flattened (LibMTL sums them over the batch first).

    References: LibMTL main `Aligned_MTL` (α = B.sum(0); it calls `torch.symeig`, which torch removed in 2.x)
    and torchjd 0.18 `AlignedMTL` (α = B·(1/T): the same direction divided by T). The heads get their own
    gradients (weight 1), as in both.

    Metrics: `weight/<task>`, `grad_norm/<task>`, `grad_cos/<a>/<b>`, `aligned_mtl/condition` (√(λ_max/λ_min)
    of the kept eigenvalues: how unbalanced the gradients were).
    """

    HOST_SOLVE = "the Gramian's eigendecomposition (numpy `eigh`)"

    def __init__(self, scale_mode: str = "min") -> None:
        """
        scale_mode: the common singular value: min (the paper), median or rmse (the mean eigenvalue).
        """
        super().__init__()
        self.scale_mode = one_of("scale_mode", scale_mode, SCALE_MODES)

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        return host_solution(gram, "aligned_mtl/condition", lambda g: aligned_weights(g, self.scale_mode))


class AlignedMTL(GramianBalancer):
    """AlignedMTL (`AlignedMTLWeighting`) as a balancer: `balancer=aligned_mtl`."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        grad_source: Literal["shared_params", "shared_rep"] = "shared_params",
        scale_mode: str = "min",
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        grad_source: shared_params (exact per-task gradients) or shared_rep (at the shared representation).
        scale_mode: the common singular value: min (the paper), median or rmse (the mean eigenvalue).
        """
        super().__init__(task_names, shared_params, AlignedMTLWeighting(scale_mode=scale_mode), grad_source)
