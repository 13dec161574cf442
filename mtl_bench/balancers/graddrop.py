"""Chen et al., NeurIPS 2020, "Just Pick a Sign: Optimizing Deep Multitask Models with Gradient Sign Dropout"
(GradDrop)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.checks import number
from mtl_bench.balancers.seeded import SeededGenerator
from mtl_bench.gradient_engine.balancer import Context
from mtl_bench.gradient_engine.gradient_balancer import GradientBalancer
from mtl_bench.gradient_engine.gramian import gram_metrics
from mtl_bench.gradient_engine.leaf_grads import write_leaf_grads
from mtl_bench.gradient_engine.rank_average import rank_mean
from mtl_bench.gradient_engine.staged import JOINT
from mtl_bench.gradient_engine.task_grads import grads_at_shared


class GradDrop(GradientBalancer):
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
        super().__init__(task_names, shared_params, "shared_rep")
        self.leak = number("leak", leak, 0, 1)
        self.rng = SeededGenerator(seed)

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        self.check_losses(losses)
        scale = self._begin(JOINT, ctx, shared)
        rows, heads = grads_at_shared([losses[n] for n in self.task_names], shared, scale, self._param_ids)
        write_leaf_grads([pair for task in heads for pair in task])
        signed = (rows * shared.detach().sign()).sum(1)  # (T, *features): summed over the batch
        purity = 0.5 * (1 + signed.sum(0) / (signed.abs().sum(0) + 1e-7))
        draw = torch.rand(purity.shape, generator=self.rng.generator, dtype=purity.dtype).to(purity.device)
        keep = (purity > draw) & (signed > 0) | (purity < draw) & (signed < 0)
        factor = self.leak + (1 - self.leak) * keep.to(rows.dtype)
        kept = rows * factor.unsqueeze(1)
        shared.backward(kept.sum(0))

        flat, flat_kept = rows.flatten(1).float(), kept.flatten(1).float()
        coefficient = (flat_kept * flat).sum(1) / (flat * flat).sum(1).clamp_min(1e-30)
        metrics = {tags.weight(n): v for n, v in zip(self.task_names, coefficient.unbind())}
        if self.measuring:  # the Gramian is only measured
            gram = flat @ flat.T
            gram = rank_mean(gram / (scale * scale) if scale is not None else gram)
            metrics.update(gram_metrics(gram, self.task_names))
        kept_fraction = keep.flatten(1).float().mean(1)
        metrics.update({f"graddrop/kept/{n}": v for n, v in zip(self.task_names, kept_fraction.unbind())})
        self._end_joint()
        return metrics
