"""Chen et al., NeurIPS 2020, "Just Pick a Sign: Optimizing Deep Multitask Models with Gradient Sign Dropout"
(GradDrop)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.aggregator import Aggregation, Aggregator
from mtl_bench.balancers.checks import number
from mtl_bench.balancers.seeded import SeededGenerator
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.aggregator_balancer import AggregatorBalancer
from mtl_bench.gradient_engine.balancer import task_list


class GradDropAggregator(Aggregator):
    """Gradient sign dropout at the shared representation: per feature, the sign purity
    P = ½(1 + Σ_i s_i / Σ_i |s_i|) of the tasks' batch-summed signed gradients s_i = Σ_batch ∇_Z L_i·sign(Z)
    decides, with one uniform draw U per feature, which sign survives (positive if P > U, negative if P < U);
    each task's gradient at the representation keeps its entries of that sign (`leak`: the fraction kept of
    the others), and the sum goes back through the trunk. The heads get their own gradients (weight 1).

    It always takes its gradients at the shared representation (no grad_source option: the method is defined on
    activations, as LibMTL requires rep_grad=True); no per-task mode (the signs of different batches do not
    mix). Reference: LibMTL 1.1.5 `GradDrop`; U comes from this class's own seeded generator (LibMTL: the global
    RNG, `torch.rand_like`), whose state is in `state_dict`. Under DDP each rank draws the same U (same
    generator) for its own batch.

    Metrics: `weight/<task>` (the kept part's coefficient on the task's gradient, ⟨g̃_i, g_i⟩/‖g_i‖²),
    `grad_norm/<task>`, `grad_cos/<a>/<b>` (at the representation), `graddrop/kept/<task>` (fraction of
    features whose gradient the task keeps).
    """

    reads_representation = True  # the signs of Z

    def __init__(self, task_names: Sequence[str], leak: float = 0.0, seed: Optional[int] = None) -> None:
        """
        task_names: the tasks, sorted (the order of the rows).
        leak: the fraction of a dropped gradient that is kept anyway, in [0, 1].
        seed: seed of the generator of the sign draws; None draws one from torch's global RNG.
        """
        super().__init__()
        self.task_names = list(task_names)
        self.leak = number("leak", leak, 0, 1)
        self.rng = SeededGenerator(seed)

    def extra_repr(self) -> str:
        return f"leak={self.leak}"

    def forward(
        self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor, shared: Optional[Tensor] = None
    ) -> Aggregation:
        (rows,) = blocks  # (T, *shared.shape): the gradients at the representation
        assert shared is not None  # given to an aggregator that reads_representation
        signed = (rows * shared.sign()).sum(1)  # (T, *features): summed over the batch
        purity = 0.5 * (1 + signed.sum(0) / (signed.abs().sum(0) + 1e-7))
        draw = torch.rand(purity.shape, generator=self.rng.generator, dtype=purity.dtype).to(purity.device)
        keep = (purity > draw) & (signed > 0) | (purity < draw) & (signed < 0)
        factor = self.leak + (1 - self.leak) * keep.to(rows.dtype)
        kept = rows * factor.unsqueeze(1)
        flat, flat_kept = rows.flatten(1).float(), kept.flatten(1).float()
        coefficient = (flat_kept * flat).sum(1) / (flat * flat).sum(1).clamp_min(1e-30)
        kept_fraction = keep.flatten(1).float().mean(1)
        metrics = {f"graddrop/kept/{n}": v for n, v in zip(self.task_names, kept_fraction.unbind())}
        return Aggregation([kept.sum(0)], Solution(coefficient, metrics=metrics))


class GradDrop(AggregatorBalancer):
    """GradDrop (`GradDropAggregator`) as a balancer: `balancer=graddrop`; at the shared representation."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        leak: float = 0.0,
        seed: Optional[int] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine; unused: GradDrop works at the
            representation).
        leak: the fraction of a dropped gradient that is kept anyway, in [0, 1].
        seed: seed of the generator of the sign draws; None draws one from torch's global RNG.
        """
        aggregator = GradDropAggregator(sorted(task_list(type(self), task_names)), leak, seed)
        super().__init__(task_names, shared_params, aggregator, "shared_rep")
