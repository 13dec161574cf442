"""Fernando et al., ICLR 2023, "Mitigating Gradient Bias in Multi-objective Learning: A Provably Convergent
Approach" (MoCo)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.checks import at_least, number
from mtl_bench.gradient_engine.balancer import BackwardContext, Context
from mtl_bench.gradient_engine.gradient_balancer import GradientBalancer
from mtl_bench.gradient_engine.gramian import gram_metrics, gramian
from mtl_bench.gradient_engine.leaf_grads import write_leaf_grads
from mtl_bench.gradient_engine.rank_average import rank_mean, world_size
from mtl_bench.gradient_engine.staged import JOINT
from mtl_bench.gradient_engine.task_grads import float_task_rows, pieces_norm


class MoCo(GradientBalancer):
    """Tracked gradients y_i follow each task's gradient, rescaled to norm L_i (ĝ_i = g_i L_i / (‖g_i‖ + 1e-8)):
    y ← y − β_k (y − ĝ); the weights take one step on the min-norm objective of the tracked gradients,
    λ ← softmax(λ − γ_k (Y Yᵀ + ρ I) λ); the update is d = Yᵀλ (the tracked gradients, not this batch's).
    β_k = β / k^{β_σ}, γ_k = γ / k^{γ_σ} at step k; λ starts at 1/T, y at 0. The g_i are the exact per-task
    gradients at the shared parameters (no grad_source option: MoCo has no shared_rep mode, as in LibMTL).

    Reference: LibMTL main `MoCo` (commit 4336804, "based on the authors' sharing code"), including its softmax
    of λ itself (not of logits) and its defaults (β = 0.5, β_σ = 0.5, γ = 0.1, γ_σ = 0.5, ρ = 0). The heads get
    their own gradients (weight 1), as there. y (T values per shared parameter), λ and the step count are
    buffers. Under DDP the per-task gradients are averaged over the ranks first (one all-reduce of T times the
    shared parameters per step), so every rank tracks the gradients of the global batch and holds the same y.

    Metrics: `weight/<task>` (λ), `grad_norm/<task>`, `grad_cos/<a>/<b>` (of this batch's gradients).
    """

    lambdas: Tensor
    steps: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        beta: float = 0.5,
        beta_sigma: float = 0.5,
        gamma: float = 0.1,
        gamma_sigma: float = 0.5,
        rho: float = 0.0,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        beta: the tracking rate β of y (> 0).
        beta_sigma: its decay: β_k = β / k^beta_sigma (>= 0).
        gamma: the step γ of the weights (> 0).
        gamma_sigma: its decay: γ_k = γ / k^gamma_sigma (>= 0).
        rho: the L2 term ρ in the weights' step (>= 0).
        """
        super().__init__(task_names, shared_params, "shared_params")
        self.beta, self.beta_sigma = number("beta", beta, 0, above=True), at_least("beta_sigma", beta_sigma, 0)
        self.gamma, self.gamma_sigma = number("gamma", gamma, 0, above=True), at_least("gamma_sigma", gamma_sigma, 0)
        self.rho = at_least("rho", rho, 0)
        t = len(self.task_names)
        self.register_buffer("lambdas", torch.full((t,), 1.0 / t))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        for k, p in enumerate(self._params):
            self.register_buffer(f"tracked_{k}", torch.zeros((t, *p.shape), dtype=torch.float32))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, beta={self.beta}, gamma={self.gamma}"

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        """On one process without accumulation each task's tracked gradient is updated from its gradient as the
        task's backward returns it (`float_task_rows`): no Jacobian is copied, and no Gramian of it is needed (its
        diagonal is the norms, taken while each gradient is in cache). Otherwise the Jacobian's path
        (`aggregate`: DDP averages J, accumulation sums it), which runs the same arithmetic row by row."""
        context = BackwardContext.of(ctx)
        if world_size() > 1 or (context is not None and context.accumulation_steps > 1):
            return super().backward(losses, shared, ctx)
        self.check_losses(losses)
        scale = self._begin(JOINT, ctx, shared)
        ordered = [losses[name] for name in self.task_names]
        loss_values = self._mean("losses", torch.stack([loss.detach().float() for loss in ordered]))
        heads: list[tuple[Tensor, Tensor]] = []
        rows = float_task_rows(ordered, shared, self._params, scale, self._param_ids, heads)
        metrics = self._track(rows, scale, loss_values, heads)
        self._end_joint()
        return metrics

    def aggregate(
        self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor, shared: Optional[Tensor]
    ) -> dict[str, Tensor]:
        grads = [rank_mean(b.float()) for b in blocks]  # of the scaled losses: 1/scale goes into the factors below
        return self._track(([g[i] for g in grads] for i in range(len(self.task_names))), scale, rank_mean(losses), [])

    def _track(
        self,
        rows: Iterable[Sequence[Tensor]],
        scale: Optional[Tensor],
        losses: Tensor,
        heads: list[tuple[Tensor, Tensor]],
    ) -> dict[str, Tensor]:
        """The step from the task gradients g_i (of the scaled losses), given task by task as one piece per shared
        parameter: y_i − β_k (y_i − ĝ_i) as (1 − β_k) y_i + β_k ĝ_i into a kept buffer (it becomes the state by
        trading places with it), then λ and d = Yᵀλ, written with the heads' gradients (filled while the rows are
        read)."""
        t = len(self.task_names)
        k = (self.steps + 1).to(torch.float32)
        beta_k, gamma_k = self.beta / k**self.beta_sigma, self.gamma / k**self.gamma_sigma
        keep = 1 - beta_k
        current = [self._current(f"tracked_{j}") for j in range(len(self._params))]
        tracked = [self._staging_buffer(f"tracked_{j}", y) for j, y in enumerate(current)]
        norms, kept = [], []
        for i, g_i in enumerate(rows):
            norm = pieces_norm(g_i)  # ‖g_i‖ while g_i is in cache
            norm = norm / scale if scale is not None else norm
            coefficient = beta_k * (losses[i] / (norm + 1e-8))  # each gradient rescaled to norm L_i
            coefficient = coefficient / scale if scale is not None else coefficient
            for g, y, new in zip(g_i, current, tracked):
                torch.mul(y[i], keep, out=new[i]).addcmul_(g, coefficient)
            norms.append(norm)
            if self.measuring:  # grad_norm/grad_cos need every pair of this batch's gradients
                kept.append(g_i)
        self._require_finite(torch.stack(norms), losses)
        step = (gramian(tracked) + self.rho * torch.eye(t, device=losses.device)) @ self.lambdas
        lambdas = torch.softmax(self.lambdas - gamma_k * step, dim=-1)
        self._stage(lambdas=lambdas, steps=self.steps + 1, **{f"tracked_{j}": y for j, y in enumerate(tracked)})
        directions = [(p, (lambdas @ y.reshape(t, -1)).view(y.shape[1:])) for p, y in zip(self._params, tracked)]
        if scale is not None:  # .grad holds scaled gradients until the scaler unscales
            directions = [(p, d.mul_(scale)) for p, d in directions]
        write_leaf_grads([*directions, *heads])
        metrics = {tags.weight(n): v for n, v in zip(self.task_names, lambdas.unbind())}
        if kept:
            gram = gramian([torch.stack(pieces) for pieces in zip(*kept)])
            metrics.update(gram_metrics(gram / (scale * scale) if scale is not None else gram, self.task_names))
        return metrics
