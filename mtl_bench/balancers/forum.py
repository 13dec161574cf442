"""Ye et al., ECAI 2024, "A First-Order Multi-Gradient Algorithm for Multi-Objective Bi-Level Optimization"."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
from scipy.optimize import minimize
from torch import Tensor

from mtl_bench.balancers.adam_update import adam_update
from mtl_bench.balancers.checks import number
from mtl_bench.balancers.loss_weighting import GraphSolution, LossWeighting
from mtl_bench.balancers.softmax_logits import (
    bilevel_source,
    hold_softmax_logits,
    no_per_task_mode,
    one_micro_batch,
    stacked,
    unscale,
)
from mtl_bench.balancers.validation_source import ValidationSource
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.balancer import task_list
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer
from mtl_bench.gradient_engine.staged import scaled_grad

# LibMTL stops the inner SGD steps once f exceeds this ("caused by too large inner_lr and inner_step").
INNER_LOSS_LIMIT = 1e5


class FORUMWeighting(LossWeighting):
    """FORUM: task logits α (start at 1/T) and the network θ descend together, (α, θ) along one direction
    that lowers every task's validation loss F_t(θ) while keeping θ near the minimizer of the inner problem
    f(α, θ) = Σ_i softmax(α)_i L_i(θ) (its value-function gap q as a constraint):

        g_f = ∇_(α,θ) f(α, θ) on the training batch
        θ^K: K = inner_step SGD steps of f(α, ·) from θ (lr inner_lr) on the same batch
        g_q = g_f − (∇_α f(α, θ^K), 0)                       (the gradient of q = f − f(α, θ^K))
        g_F_t = (0, ∇_θ F_t(θ) / ‖∇_θ F_t(θ)‖) on the validation batch
        π_t = φ − ⟨g_q, g_F_t⟩ / (‖g_q‖² + 1e-8)
        w = argmin_{w ≥ 0, Σ_{t<T} w_t = 1, w_T ≥ Σ_t w_t π_t} ‖A^T w‖² − w_T φ (‖g_q‖² + 1e-8),  A = [g_F; g_q]
        λ ← λ + (w_{<T} − λ) / (epoch + 1)^(3/4)             (λ starts at 0)
        ν = max(Σ_t λ_t π_t, 0),   d = Σ_t λ_t g_F_t + ν g_q
        α ← Adam(α, d_α; lr=outer_lr);   θ's gradient ← d_θ (the optimizer then steps θ)

    Reference: LibMTL main, `Trainer.bacth_forward_FORUM`, `Trainer._prepare_tw` and `Trainer.train_bilevel`
    in LibMTL/trainer.py (commit 4336804847eaa5e0b924b743d76beec7ac3fdc97). Followed step for step: softmax
    weights, LibMTL's defaults (outer_lr 1e-3, inner_lr 0.1, inner_step 5, φ 0.1), the inner SGD on a copy
    that stops once f > 1e5, validation gradients normalized without an epsilon, the λ average at the
    epoch's rate (`ctx.epoch`, from 0, as LibMTL's epoch index), Adam with torch's default betas and eps.
    Where ours differs:
    - The quadratic program: LibMTL hands cvxpy ‖S w‖² with S = AAᵀ's square root by an eigendecomposition
      (negative eigenvalues clipped to 0) and its default solver (OSQP in our environment); we solve wᵀ G₊ w
      with G₊ = S² (the same matrix, from `eigh`) by scipy's SLSQP in float64 (scipy is a dependency, cvxpy
      only a test extra). Where the program is well conditioned both give the same w (to 1e-6 in the tests,
      T <= 5); where it is flat along some direction (T = 10) both reach the same minimum (to 1e-8) but w
      may differ by ~1e-5 between any two solvers, cvxpy's own included. A program that is not finite, or an
      SLSQP answer that is not feasible (to 1e-6), gives a NaN w: the step is skipped (the engine counts it
      and stops a run that skips too many) and α and λ keep their values.
    - The data: LibMTL's inner batch and outer batch are two independent half-size batches of the training
      data; here the inner batch is the step's training batch (so g_f comes from the step's own graph: one
      forward fewer) and the outer batch comes from `validation` (the engine's validation stream,
      `trainer.validation_source`, a full batch). As in LibMTL, the validation forward runs on the model
      itself (its BatchNorm statistics see the validation batch) and the inner steps on copies of its buffers.
    - No host read for LibMTL's `loss.item() > 1e5` test (a device-side mask). The program itself runs on the
      host: one host sync per step (the (T+1)² Gram matrix and π), as LibMTL's.

    Where SGD at inner_lr diverges on the model, the last inner iterate's loss (only the ones before it are checked
    against 1e5, as in LibMTL) may be infinite: g_q and the program are then not finite and the step is skipped.

    An `on_graph` weighting: g_f comes from the step's own losses and their graph, and its `GraphSolution`'s objective
    Σ_p ⟨d_p, p⟩, whose gradient is d_θ, is what the engine backpropagates (through `ctx.scale`). Needs a validation
    source (`validation`, given by the engine); one process, joint mode, no gradient accumulation (the balancer refuses
    them). Under fp16 every gradient is taken through the grad scaler's scale and divided by it. `epoch` is the
    context's `ctx.epoch`: outside the engine what the loop sets (0 by default and without a context: λ is then the
    program's w of each step).

    Cost per step: the step's forward, one backward for g_f, inner_step forwards and backwards (plus one
    forward) at the inner copies, one forward and T backwards on the validation batch, and the program.

    Metrics: `weight/<task>` (softmax(α) used this step). α, its Adam moments and λ are buffers.
    """

    on_graph = True
    HOST_SOLVE = "scipy's SLSQP on the (T+1)×(T+1) program"
    task_names: list[str]
    validation: ValidationSource
    logits: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    opt_step: Tensor
    lambdas: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        outer_lr: float,
        inner_lr: float,
        inner_step: int,
        phi: float,
        validation: ValidationSource,
    ) -> None:
        """Options as `FORUM`'s, checked there; `task_names` in the balancer's (sorted) order."""
        super().__init__()
        self.task_names, self.outer_lr, self.inner_lr = list(task_names), outer_lr, inner_lr
        self.inner_step, self.phi = inner_step, phi
        hold_softmax_logits(self, len(self.task_names), validation)
        self.register_buffer("lambdas", torch.zeros(len(self.task_names)))

    def extra_repr(self) -> str:
        return f"outer_lr={self.outer_lr}, inner_lr={self.inner_lr}, inner_step={self.inner_step}, phi={self.phi}"

    def forward(  # type: ignore[override]  # an on_graph forward: the losses one by one, the scale, the epoch
        self, losses: Sequence[Tensor], scale: Optional[Tensor] = None, epoch: int = 0
    ) -> GraphSolution:
        """z = softmax(α) (reported), the new α and λ as the state, and the objective whose gradient is d_θ."""
        source = self.validation
        # fp16: gradients through the loss scale, then divided by it (their fp16 backward underflows otherwise).
        trainable = source.trainable_parameters()
        names, params = list(trainable), list(trainable.values())
        ordered = torch.stack(list(losses))
        alpha = self.logits
        z = torch.softmax(alpha, dim=-1)
        n = len(self.task_names)

        # g_f: the θ part from this step's graph; the α part is the softmax's backward, as autograd computes it.
        g_f = self._flat(self._scaled_grad((z * ordered).sum(), params, scale), params, scale)
        g_f_alpha = self._softmax_grad(z, ordered.detach())

        # θ^K: inner_step SGD steps of f(α, ·) on the training batch, from θ, at copies of the parameters.
        inputs, targets = source.training_batch()
        current = {name: p.detach() for name, p in zip(names, params)}
        going = torch.ones((), dtype=torch.bool, device=ordered.device)
        for _ in range(self.inner_step):
            current = {name: p.detach().requires_grad_() for name, p in current.items()}
            inner = (z.detach() * stacked(self.task_names, source.task_losses(inputs, targets, current))).sum()
            going = going & ~(inner.detach() > INNER_LOSS_LIMIT)  # LibMTL breaks out of its loop here
            found = self._scaled_grad(inner, list(current.values()), scale)
            with torch.no_grad():
                current = {
                    name: torch.where(going, p - self.inner_lr * unscale(g, scale), p) if g is not None else p
                    for (name, p), g in zip(current.items(), found)
                }
        with torch.no_grad():
            at_inner = stacked(self.task_names, source.task_losses(inputs, targets, current))
        g_q_alpha = (g_f_alpha - self._softmax_grad(z, at_inner)).to(g_f.dtype)
        g_q = torch.cat([g_q_alpha, g_f])

        # g_F: each task's validation gradient at θ, normalized, zero in α. The model itself runs this forward.
        val_inputs, val_targets = source.next_validation_batch()
        outer = stacked(self.task_names, source.task_losses(val_inputs, val_targets))
        g_F = torch.stack([self._flat(self._scaled_grad(outer[i], params, scale), params, scale) for i in range(n)])
        g_F = g_F / g_F.pow(2).sum(-1).sqrt().unsqueeze(1)
        g_F = torch.cat([g_F.new_zeros(n, n), g_F], dim=1)

        q_norm = g_q.norm().pow(2) + 1e-8
        pi = self.phi - (g_F @ g_q) / q_norm
        a = torch.cat([g_F, g_q.unsqueeze(0)])
        # The step's one host sync: the program runs on the host (as LibMTL's cvxpy).
        host = torch.cat([(a @ a.T).reshape(-1), pi, q_norm.reshape(1)]).double().cpu().numpy()
        gram, pi_host, q_norm_host = host[: (n + 1) ** 2].reshape(n + 1, n + 1), host[-n - 1 : -1], host[-1]
        w = torch.as_tensor(forum_weights(gram, pi_host, self.phi * q_norm_host), device=alpha.device)

        lambdas = self.lambdas + (w[:n].to(self.lambdas.dtype) - self.lambdas) / (epoch + 1) ** 0.75
        nu = (lambdas.to(pi.dtype) * pi).sum().clamp(min=0)
        direction = lambdas.to(g_F.dtype) @ g_F + nu * g_q
        with torch.no_grad():
            new, exp_avg, exp_avg_sq, step = adam_update(
                alpha,
                direction[:n].to(alpha.dtype),
                self.exp_avg,
                self.exp_avg_sq,
                self.opt_step,
                self.outer_lr,
                (0.9, 0.999),
                1e-8,
            )
        state = {"logits": new, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "opt_step": step, "lambdas": lambdas}

        # θ's gradient is d_θ: the objective Σ_p ⟨d_p, p⟩, which the engine backpropagates through its scale.
        pieces = direction[n:].detach().split([p.numel() for p in params])
        surrogate = torch.stack([(d.view_as(p) * p).sum() for d, p in zip(pieces, params)]).sum()
        return GraphSolution(Solution(z, state=state), surrogate)

    @staticmethod
    def _scaled_grad(loss: Tensor, params: Sequence[Tensor], scale: Optional[Tensor]) -> tuple[Optional[Tensor], ...]:
        """Gradient of one loss through the loss scale (None where it does not reach), the graph kept."""
        return scaled_grad(loss, params, scale, retain_graph=True, allow_unused=True)

    @staticmethod
    def _softmax_grad(z: Tensor, losses: Tensor) -> Tensor:
        """∇_α Σ softmax(α)_i L_i = z ∘ (L − z·L): the softmax's backward, as autograd computes it."""
        return z * (losses - (losses * z).sum())

    @classmethod
    def _flat(cls, grads: Sequence[Optional[Tensor]], params: Sequence[Tensor], scale: Optional[Tensor]) -> Tensor:
        """One flat vector of the gradients (zeros for a parameter the loss does not reach), unscaled."""
        return torch.cat(
            [(unscale(g, scale) if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)]
        )


class FORUM(LossWeightingBalancer):
    """FORUM (`FORUMWeighting`) as a balancer: `balancer=forum`."""

    # what must see one batch of every task in one process (for the messages)
    ONE_BATCH_WORK, VALIDATION_WORK, STEP_WORK = "its inner steps", "validation gradients", "its inner steps"

    def __init__(
        self,
        task_names: Sequence[str],
        outer_lr: float = 1e-3,
        inner_lr: float = 0.1,
        inner_step: int = 5,
        phi: float = 0.1,
        world_size: int = 1,
        validation: Optional[ValidationSource] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        outer_lr: the lr of the logits' Adam (> 0; LibMTL's --outer_lr default 1e-3).
        inner_lr: the lr of the inner SGD steps (> 0; LibMTL's --inner_lr default 0.1).
        inner_step: the number of inner SGD steps (an int >= 1; LibMTL's --inner_step default 5).
        phi: φ, the constraint's margin (>= 0; LibMTL's --FORUM_phi default 0.1).
        world_size: the number of DDP processes (given by the engine); must be 1.
        validation: the training batch, validation batches, task losses and parameters (given by the engine; in
            your own loop, any ValidationSource).
        """
        task_names = task_list(type(self), task_names)  # a mapping is refused first, as by every balancer
        source = bilevel_source(type(self).__name__, world_size, validation, self.ONE_BATCH_WORK)
        weighting = FORUMWeighting(
            sorted(task_names),
            number("outer_lr", outer_lr, 0, above=True),
            number("inner_lr", inner_lr, 0, above=True),
            number("inner_step", inner_step, 1, integer=True),
            number("phi", phi, 0, finite=True),
            source,
        )
        super().__init__(task_names, weighting)

    def per_task_problem(self) -> str:
        return no_per_task_mode(self, self.ONE_BATCH_WORK, self.VALIDATION_WORK)

    def accumulation_problem(self, steps: int) -> Optional[str]:
        return one_micro_batch(self, steps, self.STEP_WORK)


def forum_weights(gram: np.ndarray, pi: np.ndarray, w_constant: float) -> np.ndarray:
    """FORUM's program: argmin wᵀ G₊ w − w_T · w_constant over w ≥ 0, Σ_{t<T} w_t = 1, w_T ≥ Σ_t w_t π_t,
    where G₊ is `gram` (AAᵀ, (T+1)²) with its negative eigenvalues clipped to 0, as LibMTL's square root.
    SLSQP from w = (1/T, ..., 1/T, max(mean π, 0)); NaNs when the program is not finite or the answer not feasible."""
    n = len(pi)
    if not (np.isfinite(gram).all() and np.isfinite(pi).all() and np.isfinite(w_constant)):
        return np.full(n + 1, np.nan)
    values, vectors = np.linalg.eigh(gram)
    g = (vectors * np.maximum(values, 0)) @ vectors.T
    linear = np.zeros(n + 1)
    linear[-1] = -w_constant
    sum_row, cone_row = np.append(np.ones(n), 0.0), np.append(-pi, 1.0)
    result = minimize(
        lambda w: w @ g @ w + linear @ w,
        np.append(np.full(n, 1.0 / n), max(pi.mean(), 0.0)),
        jac=lambda w: 2 * g @ w + linear,
        method="SLSQP",
        bounds=[(0.0, None)] * (n + 1),
        constraints=[
            {"type": "eq", "fun": lambda w: sum_row @ w - 1, "jac": lambda w: sum_row},
            {"type": "ineq", "fun": lambda w: cone_row @ w, "jac": lambda w: cone_row},
        ],
        options={"ftol": 1e-12, "maxiter": 500},
    )
    w = result.x
    # SLSQP often ends at "positive directional derivative" at the optimum's precision: judge its answer itself.
    feasible = w.min() >= -1e-6 and abs(sum_row @ w - 1) <= 1e-6 and cone_row @ w >= -1e-6
    return w if feasible and np.isfinite(w).all() else np.full(n + 1, np.nan)
