"""Fernando et al., ICLR 2023, "Mitigating Gradient Bias in Multi-objective Learning: A Provably Convergent
Approach" (MoCo)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.jacobian import GradientBalancer, gram_metrics, gramian, rank_mean, write_leaf_grads


class MoCo(GradientBalancer):
    """Tracked gradients y_i follow each task's gradient, rescaled to norm L_i (ĝ_i = g_i L_i / (‖g_i‖ + 1e-8)):
    y ← y − β_k (y − ĝ); the weights take one step on the min-norm objective of the tracked gradients,
    λ ← softmax(λ − γ_k (Y Yᵀ + ρ I) λ); the update is d = Yᵀλ (the tracked gradients, not this batch's).
    β_k = β / k^{β_σ}, γ_k = γ / k^{γ_σ} at step k; λ starts at 1/T, y at 0.

    Reference: LibMTL main `MoCo` (commit 4336804, "based on the authors' sharing code"), including its softmax
    of λ itself (not of logits) and its defaults (β = 0.5, β_σ = 0.5, γ = 0.1, γ_σ = 0.5, ρ = 0). The heads get
    their own gradients (weight 1), as there. y (T values per shared parameter), λ and the step count are
    buffers. Under DDP the per-task gradients are averaged over the ranks first (one all-reduce of T times the
    shared parameters per step), so every rank tracks the gradients of the global batch and holds the same y.

    Metrics: `weight/<task>` (λ), `grad_norm/<task>`, `grad_cos/<a>/<b>` (of this batch's gradients).
    """

    SOURCES = ("shared_params",)

    lambdas: Tensor
    steps: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        grad_source: str = "shared_params",
        beta: float = 0.5,
        beta_sigma: float = 0.5,
        gamma: float = 0.1,
        gamma_sigma: float = 0.5,
        rho: float = 0.0,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        grad_source: shared_params (exact per-task gradients); MoCo has no shared_rep mode (as LibMTL).
        beta: the tracking rate β of y (> 0).
        beta_sigma: its decay: β_k = β / k^beta_sigma (>= 0).
        gamma: the step γ of the weights (> 0).
        gamma_sigma: its decay: γ_k = γ / k^gamma_sigma (>= 0).
        rho: the L2 term ρ in the weights' step (>= 0).
        """
        super().__init__(task_names, shared_params, grad_source)
        for name, value, low in (
            ("beta", beta, 0.0),
            ("gamma", gamma, 0.0),
            ("beta_sigma", beta_sigma, None),
            ("gamma_sigma", gamma_sigma, None),
            ("rho", rho, None),
        ):
            ok = not isinstance(value, bool) and isinstance(value, (int, float))
            if not ok or (value <= low if low is not None else not value >= 0):
                raise ValueError(f"{name}: must be a number {'> 0' if low is not None else '>= 0'}, got {value!r}")
        self.beta, self.beta_sigma, self.gamma, self.gamma_sigma, self.rho = (
            float(beta),
            float(beta_sigma),
            float(gamma),
            float(gamma_sigma),
            float(rho),
        )
        t = len(self.task_names)
        self.register_buffer("lambdas", torch.full((t,), 1.0 / t))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        for k, p in enumerate(self._params):
            self.register_buffer(f"tracked_{k}", torch.zeros((t, *p.shape), dtype=torch.float32))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, beta={self.beta}, gamma={self.gamma}"

    def _finish_solve(
        self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor, shared: Optional[Tensor]
    ) -> dict[str, Tensor]:
        t = len(self.task_names)
        grads = [rank_mean(b.float()) for b in blocks]  # of the scaled losses: 1/scale goes into the factors below
        losses = rank_mean(losses)
        gram = gramian(grads)
        if scale is not None:
            gram = gram / (scale * scale)
        self._require_finite(gram, losses)
        factor = losses / (gram.diagonal().clamp_min(0).sqrt() + 1e-8)  # each gradient rescaled to norm L_i
        k = (self.steps + 1).to(torch.float32)
        beta_k, gamma_k = self.beta / k**self.beta_sigma, self.gamma / k**self.gamma_sigma
        coefficient = beta_k * factor if scale is None else beta_k * factor / scale
        tracked = []
        for i, g in enumerate(grads):  # y − β_k (y − ĝ) as (1 − β_k) y + β_k ĝ, in two passes over a kept buffer
            y = self._current(f"tracked_{i}")
            new = torch.mul(y, 1 - beta_k, out=self._staging_buffer(f"tracked_{i}", y))
            tracked.append(new.addcmul_(g, coefficient.view(-1, *([1] * (g.dim() - 1)))))
        step = (gramian(tracked) + self.rho * torch.eye(t, device=gram.device)) @ self.lambdas
        lambdas = torch.softmax(self.lambdas - gamma_k * step, dim=-1)
        self._stage(lambdas=lambdas, steps=self.steps + 1, **{f"tracked_{i}": y for i, y in enumerate(tracked)})
        directions = [(p, (lambdas @ y.reshape(t, -1)).view(y.shape[1:])) for p, y in zip(self._params, tracked)]
        if scale is not None:  # .grad holds scaled gradients until the scaler unscales
            directions = [(p, d.mul_(scale)) for p, d in directions]
        write_leaf_grads(directions)
        metrics = {tags.weight(n): v for n, v in zip(self.task_names, lambdas.unbind())}
        if self.measuring:
            metrics.update(gram_metrics(gram, self.task_names))
        return metrics
