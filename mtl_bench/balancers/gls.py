"""Chennupati et al., CVPR Workshops 2019, "MultiNet++: Multi-Stream Feature Aggregation and Geometric Loss
Strategy for Multi-Task Learning" (GLS)."""

from __future__ import annotations

import torch
from torch import Tensor

from mtl_bench.balancers.scalarization import ScalarizedBalancer


class GeometricLoss(ScalarizedBalancer):
    """Geometric loss strategy: trains on the geometric mean of the losses, (Π_i L_i)^{1/T}, computed as
    exp(mean_i log L_i) so that many small or large losses neither underflow nor overflow the product.
    w_i = (Π_j L_j)^{1/T} / (T·L_i). The losses must be positive.

    Reference: LibMTL 1.1.5 `GLS` (`torch.pow(losses.prod(), 1/T)`, the same gradient; the weights it returns,
    L_i / (T·Π_j L_j), are not the ones its backward used) and torchjd 0.18 `scalarization.GeometricMean`.
    No per-task mode: w_i needs every task's loss.

    task_names: the tasks (given by the engine; GLS has no option).

    Metrics: `weight/<task>` (w_i).
    """

    def _objective(self, losses: Tensor) -> Tensor:
        return torch.exp(torch.log(losses).mean())
