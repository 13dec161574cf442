"""Fernando et al., ICLR 2023, "Mitigating Gradient Bias in Multi-objective Learning: A Provably Convergent
Approach" (MoCo)."""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.aggregator import Aggregation, Aggregator
from mtl_bench.balancers.checks import at_least, number
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.aggregator_balancer import AggregatorBalancer
from mtl_bench.gradient_engine.balancer import task_list
from mtl_bench.gradient_engine.gradient_balancer import trained
from mtl_bench.gradient_engine.gramian import gramian
from mtl_bench.gradient_engine.rank_average import rank_mean
from mtl_bench.gradient_engine.task_grads import pieces_norm


class MoCoAggregator(Aggregator):
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

    On one process without accumulation each task's tracked gradient is updated from its gradient as the task's
    backward returns it (`forward_rows`): no Jacobian is copied, and no Gramian of it is needed (its diagonal is the
    norms, taken while each gradient is in cache). Otherwise `forward` runs the same arithmetic row by row on the
    blocks (DDP averages them, accumulation sums them).

    Metrics: `weight/<task>` (λ), `grad_norm/<task>`, `grad_cos/<a>/<b>` (of this batch's gradients).
    """

    lambdas: Tensor
    steps: Tensor

    def __init__(
        self,
        tasks: int,
        shapes: Sequence[torch.Size],
        beta: float = 0.5,
        beta_sigma: float = 0.5,
        gamma: float = 0.1,
        gamma_sigma: float = 0.5,
        rho: float = 0.0,
    ) -> None:
        """
        tasks: T, the number of tasks.
        shapes: the shapes of the shared parameters (one tracked block of T gradients each).
        beta: the tracking rate β of y (> 0).
        beta_sigma: its decay: β_k = β / k^beta_sigma (>= 0).
        gamma: the step γ of the weights (> 0).
        gamma_sigma: its decay: γ_k = γ / k^gamma_sigma (>= 0).
        rho: the L2 term ρ in the weights' step (>= 0).
        """
        super().__init__()
        self.beta, self.beta_sigma = number("beta", beta, 0, above=True), at_least("beta_sigma", beta_sigma, 0)
        self.gamma, self.gamma_sigma = number("gamma", gamma, 0, above=True), at_least("gamma_sigma", gamma_sigma, 0)
        self.rho = at_least("rho", rho, 0)
        self.blocks = len(shapes)
        self.register_buffer("lambdas", torch.full((tasks,), 1.0 / tasks))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        for k, shape in enumerate(shapes):
            self.register_buffer(f"tracked_{k}", torch.zeros((tasks, *shape), dtype=torch.float32))

    def extra_repr(self) -> str:
        return f"beta={self.beta}, gamma={self.gamma}"

    def forward(self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor) -> Aggregation:
        grads = [rank_mean(b.float()) for b in blocks]  # of the scaled losses: 1/scale goes into the factors below
        return self.forward_rows(([g[i] for g in grads] for i in range(grads[0].shape[0])), scale, rank_mean(losses))

    def forward_rows(self, rows: Iterator[list[Tensor]], scale: Optional[Tensor], losses: Tensor) -> Aggregation:
        """The step from the task gradients g_i (of the scaled losses), given task by task as one piece per shared
        parameter: y_i − β_k (y_i − ĝ_i) as (1 − β_k) y_i + β_k ĝ_i into a kept buffer (it becomes the state by
        trading places with it), then λ and d = Yᵀλ."""
        t = self.lambdas.shape[0]
        k = (self.steps + 1).to(torch.float32)
        beta_k, gamma_k = self.beta / k**self.beta_sigma, self.gamma / k**self.gamma_sigma
        keep = 1 - beta_k
        current = [getattr(self, f"tracked_{j}") for j in range(self.blocks)]
        tracked = [self.staging_buffer(f"tracked_{j}", y) for j, y in enumerate(current)]
        norms = []
        for i, row in enumerate(rows):
            g_i = [g.float() for g in row]  # no copy of a float32 gradient
            norm = pieces_norm(g_i)  # ‖g_i‖ while g_i is in cache
            norm = norm / scale if scale is not None else norm
            coefficient = beta_k * (losses[i] / (norm + 1e-8))  # each gradient rescaled to norm L_i
            coefficient = coefficient / scale if scale is not None else coefficient
            for g, y, new in zip(g_i, current, tracked):
                torch.mul(y[i], keep, out=new[i]).addcmul_(g, coefficient)
            norms.append(norm)
        step = (gramian(tracked) + self.rho * torch.eye(t, device=losses.device)) @ self.lambdas
        lambdas = torch.softmax(self.lambdas - gamma_k * step, dim=-1)
        directions = [(lambdas @ y.reshape(t, -1)).view(y.shape[1:]) for y in tracked]
        if scale is not None:  # the direction is scaled as the blocks are
            directions = [d.mul_(scale) for d in directions]
        state = {"lambdas": lambdas, "steps": self.steps + 1, **{f"tracked_{j}": y for j, y in enumerate(tracked)}}
        return Aggregation(directions, Solution(lambdas, state=state), stats=[torch.stack(norms), losses])


class MoCo(AggregatorBalancer):
    """MoCo (`MoCoAggregator`) as a balancer: `balancer=moco`; at the shared parameters."""

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
        params = trained(shared_params)
        tasks = len(task_list(type(self), task_names))
        shapes = [p.shape for p in params]
        aggregator = MoCoAggregator(tasks, shapes, beta, beta_sigma, gamma, gamma_sigma, rho)
        super().__init__(task_names, params, aggregator)
