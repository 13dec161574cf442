"""Chennupati et al., CVPR Workshops 2019, "MultiNet++: Multi-Stream Feature Aggregation and Geometric Loss
Strategy for Multi-Task Learning" (GLS)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer, objective_weights


class GeometricLossWeighting(LossWeighting):
    """Geometric loss strategy: trains on the geometric mean of the losses, (Π_i L_i)^{1/T}, computed as
    exp(mean_i log L_i) so that many small or large losses neither underflow nor overflow the product.
    w_i = (Π_j L_j)^{1/T} / (T·L_i). The losses must be positive.

    Reference: LibMTL 1.1.5 `GLS` (`torch.pow(losses.prod(), 1/T)`, the same gradient; the weights it returns,
    L_i / (T·Π_j L_j), are not the ones its backward used) and torchjd 0.18 `scalarization.GeometricMean`.
    No per-task mode: w_i needs every task's loss.

    Metrics: `weight/<task>` (w_i).
    """

    def forward(self, losses: Tensor) -> Tensor:
        return objective_weights(lambda at: torch.exp(torch.log(at).mean()), losses)


class GeometricLoss(LossWeightingBalancer):
    """GLS (`GeometricLossWeighting`) as a balancer: `balancer=gls`."""

    def __init__(self, task_names: Sequence[str]) -> None:
        """
        task_names: the tasks (given by the engine; GLS has no option).
        """
        super().__init__(task_names, GeometricLossWeighting())
