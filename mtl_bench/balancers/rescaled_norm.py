"""Rescaled gradient norm loss balancer of Défossez et al. 2022, "High Fidelity Neural Audio Compression" (EnCodec)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.checks import at_least, number, stack_weights, task_weights
from mtl_bench.gradient_engine.balancer import Context, weights_first
from mtl_bench.gradient_engine.graph import task_params, upstream_leaves
from mtl_bench.gradient_engine.leaf_grads import leaf_grads_root
from mtl_bench.gradient_engine.rank_average import average_by_name
from mtl_bench.gradient_engine.staged import JOINT, PER_TASK, StagedBalancer

SMALL_HEAD_FACTOR = 4  # heads of up to this many times the shared features in parameters are small (_task_grads)


def gradient_norm(grad: Tensor, per_batch_item: bool) -> Tensor:
    """Norm of one loss's gradient at the shared output: mean over batch items of each item's norm, or global.

    A 1-D output is a batch of scalars (each item's norm is |g_b|); a 0-d output has one item. Computed in
    float32 whatever the gradient's dtype (fp16 squares overflow).
    """
    if not per_batch_item or grad.dim() == 0:
        return torch.linalg.vector_norm(grad, dtype=torch.float32)
    return torch.linalg.vector_norm(grad.reshape(grad.shape[0], -1), dim=1, dtype=torch.float32).mean()


class RescaledNormBalancer(StagedBalancer):
    """Each loss's gradient at `shared` is rescaled so that loss k contributes the share w_k/Σw of `total_norm`.

    With g_k = ∂L_k/∂shared and n_k its norm (per batch item then averaged, or global), the balancer keeps
    a bias-corrected EMA of each n_k (avg_k = Σ β^(t-s) n_k(s) / Σ β^(t-s); β = `ema_decay`, β = 1 is a
    plain mean) and trains on Σ_k scale_k·L_k with

        scale_k = (w_k / Σ_j w_j) · total_norm / (epsilon + avg_k),

    so `shared` receives Σ_k scale_k g_k (the seed's `out_grad`) and every task head receives its own
    scale (the seed's `output.backward(out_grad)` left the heads without gradients). With
    `rescale_grads=False` it is the plain weighted sum Σ w_k L_k and no per-loss gradient is computed
    (unless `monitor=True` asks for the ratios).

    Metrics: `weight/<task>` is the factor applied to L_k (scale_k, or w_k without rescaling);
    `grad_norm/<task>` the step's n_k (rank-averaged); with `monitor`, `ratio/<task>` = avg_k / Σ_j avg_j.

    Under DDP the n_k are averaged across ranks (weighted by batch size, matched by task name) before they
    enter the EMA, so all ranks hold the same EMA and scales. The seed averaged the per-rank EMAs instead;
    the two agree whenever each rank's batch size is constant over steps.
    """

    weights: Tensor
    ema_sum: Tensor
    ema_count: Tensor

    def __init__(
        self,
        task_names: Union[Sequence[str], Mapping[str, float], None] = None,
        weights: Optional[Mapping[str, float]] = None,
        rescale_grads: bool = True,
        total_norm: float = 1.0,
        ema_decay: float = 0.999,
        per_batch_item: bool = True,
        epsilon: float = 1e-12,
        monitor: bool = True,
    ) -> None:
        """
        task_names: the tasks (given by the engine); a mapping, or none with weights= given: EnCodec's forms, the
            mapping's keys are the tasks and its values the weights.
        weights: each task's share w_k of the gradient norm (>= 0); None gives every task 1.0.
        rescale_grads: rescale each loss's gradient; false trains on the plain weighted sum.
        total_norm: the norm the rescaled gradients add up to (> 0).
        ema_decay: decay of the bias-corrected EMA of each loss's gradient norm, in (0, 1]; 1 is a plain mean.
        per_batch_item: the norm per batch item, then averaged; false: the whole tensor's norm.
        epsilon: added to the averaged norm before dividing (>= 0).
        monitor: log ratio/<task> (free when rescaling: the norms are measured anyway).
        """
        task_names, given = weights_first(type(self), task_names, weights)
        super().__init__(task_names)
        weights = task_weights(given, self.task_names)
        if rescale_grads and not sum(weights.values()) > 0:
            raise ValueError(f"weights: sum to 0 ({weights}); rescaling needs a positive total weight")
        self.ema_decay = number("ema_decay", ema_decay, 0, 1, above=True, note="(1: a plain mean)")
        self.total_norm, self.epsilon = number("total_norm", total_norm, 0, above=True), at_least("epsilon", epsilon, 0)
        self.rescale_grads, self.per_batch_item, self.monitor = rescale_grads, per_batch_item, monitor
        n = len(self.task_names)
        self.register_buffer("weights", stack_weights(weights, self.task_names))
        # The bias-corrected EMA as a ratio: avg = ema_sum / ema_count, both decayed by β each step.
        self.register_buffer("ema_sum", torch.zeros(n))
        self.register_buffer("ema_count", torch.zeros(n))
        self._small_heads: Optional[bool] = None  # a speed choice between two exact backwards, not state

    @property
    def measures_norms(self) -> bool:
        return self.rescale_grads or self.monitor

    def extra_repr(self) -> str:
        return (
            f"tasks={self.task_names}, rescale_grads={self.rescale_grads}, total_norm={self.total_norm}, "
            f"ema_decay={self.ema_decay}, per_batch_item={self.per_batch_item}, monitor={self.monitor}"
        )

    # ------------------------------------------------------------------ maths

    def _measure(self, loss: Tensor, shared: Tensor, scale: Tensor | None) -> Tensor:
        """The norm of the scaled loss's gradient at `shared` (`_unscale` divides it by the scale)."""
        (grad,) = self._grad(loss, [shared], scale)
        assert grad is not None  # allow_unused=False: autograd raises rather than return None
        return gradient_norm(grad, self.per_batch_item)

    @staticmethod
    def _unscale(norms: Tensor, scale: Tensor | None) -> Tensor:
        return norms / scale if scale is not None else norms  # norms of the unscaled gradients: one division a step

    def _task_grads(
        self, losses: list[Tensor], shared: Tensor, scale: Tensor | None
    ) -> Optional[list[tuple[Tensor, list[tuple[Tensor, Tensor]]]]]:
        """Each loss's gradient at `shared` and at its own parameters (its head), from one backward through the
        head, so the final backward need not repeat the heads (as EnCodec's `input.backward(out_grad)`, which
        leaves them without gradients). None when a loss reads a parameter of the trunk other than through
        `shared` (those paths need the full backward of Σ scale_k L_k), and with small heads (below)."""
        if self._small_heads:
            return None
        trunk = upstream_leaves(shared)
        found = [task_params(loss, shared, trunk) for loss in losses]
        if not all(cut for _, cut in found):
            return None
        if self._small_heads is None:
            # With small heads (scalar outputs: up to a few times `shared`'s features in parameters per head) a
            # second backward through the heads costs less than these per-task head gradients' Python work: the full
            # backward of Σ scale_k L_k (1.08x against 1.14x the fixed step at T=10 on one CPU thread). Decided once,
            # at the first step (of a resumed run too), so that every step of a run rounds alike.
            per_head = sum(p.numel() for own, _ in found for p in own) / len(losses)
            self._small_heads = per_head <= SMALL_HEAD_FACTOR * (shared[0].numel() if shared.dim() > 0 else 1)
            if self._small_heads:
                return None
        parts = []
        for loss, (own, _) in zip(losses, found):
            grad, *heads = self._grad(loss, [shared, *own], scale)
            assert grad is not None  # allow_unused=False: autograd raises rather than return None
            parts.append((grad, [(p, g) for p, g in zip(own, heads) if g is not None]))
        return parts

    @staticmethod
    def _write(shared: Tensor, parts: list[tuple[Tensor, list[tuple[Tensor, Tensor]]]], factors: Tensor) -> None:
        """Σ_k factor_k g_k back through the trunk and factor_k ∇L_k to each head, in ONE autograd call (DDP's
        gradient hooks fire as for a plain backward)."""
        dtype = parts[0][0].dtype
        scales = factors.to(dtype).unbind()
        direction = parts[0][0] * scales[0]
        product = torch.empty_like(direction)  # one buffer for every g_k·scale_k (EnCodec's rounding: no FMA)
        for (grad, _), f in zip(parts[1:], scales[1:]):
            direction.add_(torch.mul(grad, f, out=product))
        # factor_k ∇L_k at each head (a parameter two heads share gets the sum), made here and handed to autograd
        heads = [(p, g * f.to(g.dtype)) for (_, pairs), f in zip(parts, factors.unbind()) for p, g in pairs]
        if heads:
            torch.autograd.backward([shared, leaf_grads_root(heads)], [direction, None])
        else:
            shared.backward(direction)

    def _count(self, shared: Tensor) -> int:
        return shared.shape[0] if self.per_batch_item and shared.dim() > 0 else 1

    def _ema(self, index: int | slice, norms: Tensor) -> Tensor:
        """Stage the EMA update of the given tasks from their committed values; return their new averages."""
        ema_sum, ema_count = self._current("ema_sum").clone(), self._current("ema_count").clone()
        ema_sum[index] = self.ema_sum[index] * self.ema_decay + norms
        ema_count[index] = self.ema_count[index] * self.ema_decay + 1.0
        self._stage(ema_sum=ema_sum, ema_count=ema_count)
        return ema_sum[index] / ema_count[index]

    def _scales(self, avg: Tensor, weights: Tensor) -> Tensor:
        return weights / self.weights.sum() * self.total_norm / (self.epsilon + avg)

    # ------------------------------------------------------------------ joint mode

    def backward(
        self,
        losses: dict[str, Tensor],
        shared: Tensor,
        ctx: Context = None,
    ) -> dict[str, Tensor]:
        self.check_losses(losses)
        metrics: dict[str, Tensor] = {}
        factors = self.weights
        parts = None
        if self.measures_norms:
            scale = self._begin(JOINT, ctx, shared)
            parts = self._task_grads([losses[name] for name in self.task_names], shared, scale)
            if parts is not None:
                grads = [grad for grad, _ in parts]
                local = {name: gradient_norm(grad, self.per_batch_item) for name, grad in zip(self.task_names, grads)}
            else:
                local = {name: self._measure(losses[name], shared, scale) for name in self.task_names}
            reduced = average_by_name(local, self._count(shared))
            norms = self._mean("norms", self._unscale(torch.stack([reduced[name] for name in self.task_names]), scale))
            self._require_finite(norms)
            avg = self._ema(slice(None), norms)
            if self.rescale_grads:
                factors = self._scales(avg, self.weights)
            # unbind: one view per task from one op (indexing costs an op per task, 3T per step)
            metrics.update({tags.grad_norm(name): v for name, v in zip(self.task_names, norms.unbind())})
            if self.monitor:
                ratios = avg / avg.sum()
                metrics.update({tags.ratio(name): v for name, v in zip(self.task_names, ratios.unbind())})
        if parts is not None:
            self._write(shared, parts, factors)
        else:
            stacked = torch.stack([losses[name] for name in self.task_names])
            self.run_backward((factors * stacked).sum(), ctx)  # float32 even for fp16 losses
        if self.measures_norms:
            self._end_joint()
        return {**{tags.weight(name): v for name, v in zip(self.task_names, factors.unbind())}, **metrics}

    # ------------------------------------------------------------------ per-task mode

    def backward_task(
        self,
        task: str,
        loss: Tensor,
        shared: Tensor,
        ctx: Context = None,
    ) -> dict[str, Tensor]:
        """One task's backward: its scale depends only on its own EMA and the weights, as in joint mode."""
        scale = self._begin(PER_TASK, ctx, shared)
        self._collect(task)
        i = self._index[task]
        factor = self.weights[i]
        metrics: dict[str, Tensor] = {}
        if self.measures_norms:
            norm = average_by_name({task: self._measure(loss, shared, scale)}, self._count(shared))[task]
            norm = self._mean(f"norm/{task}", self._unscale(norm, scale))
            self._require_finite(norm)
            avg = self._ema(i, norm)
            if self.rescale_grads:
                factor = self._scales(avg, self.weights[i])
            metrics[tags.grad_norm(task)] = norm
        self.run_backward(factor * loss, ctx)
        return {tags.weight(task): factor, **metrics}

    def _finish(self) -> dict[str, Tensor]:
        if not self.monitor:
            return {}
        avg = self._current("ema_sum") / self._current("ema_count")
        ratios = avg / avg.sum()
        return {tags.ratio(name): ratios[i] for i, name in enumerate(self.task_names)}
