"""Blanchard et al., NeurIPS 2017, "Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent" (Krum)."""

from __future__ import annotations

from functools import partial
from typing import Iterable, Literal, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.checks import number
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer


class KrumWeighting(Weighting):
    """(Multi-)Krum: each task gradient is scored by the sum of its distances to its T − f − 2 nearest other
    gradients (f = `n_byzantine`); the `n_selected` lowest-scoring gradients are averaged. Distances come from
    the Gramian, ‖g_i − g_j‖² = G_ii + G_jj − 2G_ij, on the device (no host sync). Needs T ≥ f + 3 tasks.

    Reference: torchjd 0.18 `Krum` (the same operations on the Gramian, ties broken by `torch.topk` as there).
    The heads get their own gradients (weight 1), as torchjd's mtl_backward gives them.

    Metrics: `weight/<task>` (1/n_selected for a selected task, else 0), `grad_norm/<task>`, `grad_cos/<a>/<b>`.
    """

    def __init__(self, task_names: Sequence[str], n_byzantine: int = 0, n_selected: int = 1) -> None:
        """
        task_names: the tasks, sorted (given by the engine).
        n_byzantine: f, the number of task gradients that may be outliers (>= 0; needs T >= f + 3).
        n_selected: how many of the best-scored gradients are averaged (1: Krum; more: Multi-Krum; <= T).
        """
        super().__init__()
        t = len(task_names)
        self.n_byzantine = number(
            "n_byzantine", n_byzantine, 0, t - 3, integer=True, note=f"for {t} tasks (at most T - 3)"
        )
        self.n_selected = number("n_selected", n_selected, 1, t, integer=True, note=f"for {t} tasks (at most T)")

    def extra_repr(self) -> str:
        return f"n_byzantine={self.n_byzantine}, n_selected={self.n_selected}"

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        t = gram.shape[0]
        sq_norms = gram.diagonal()
        distances = (sq_norms[None, :] + sq_norms[:, None] - 2 * gram).clamp(min=0.0).sqrt()
        nearest, _ = torch.topk(distances, k=t - self.n_byzantine - 1, largest=False)
        scores = nearest[:, 1:].sum(dim=1)  # the smallest distance of each row is to itself
        _, selected = torch.topk(scores, k=self.n_selected, largest=False)
        # scatter, not F.one_hot: one_hot checks the indices' range on the host on a CPU
        weights = gram.new_zeros(t).scatter_(0, selected, 1.0 / self.n_selected)
        return Solution(weights + 0 * scores.sum())  # NaN weights when G is not finite (a skipped step)


class Krum(GramianBalancer):
    """Krum (`KrumWeighting`) as a balancer: `balancer=krum`."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        grad_source: Literal["shared_params", "shared_rep"] = "shared_params",
        n_byzantine: int = 0,
        n_selected: int = 1,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        grad_source: shared_params (exact per-task gradients) or shared_rep (at the shared representation).
        n_byzantine: f, the number of task gradients that may be outliers (>= 0; needs T >= f + 3).
        n_selected: how many of the best-scored gradients are averaged (1: Krum; more: Multi-Krum; <= T).
        """
        super().__init__(
            task_names,
            shared_params,
            partial(KrumWeighting, n_byzantine=n_byzantine, n_selected=n_selected),
            grad_source,
        )
