"""Ye et al., NeurIPS 2021, "Multi-Objective Meta Learning" (MOML)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from mtl_bench.balancers.adam_update import adam_update
from mtl_bench.balancers.checks import number
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.softmax_logits import (
    bilevel_source,
    hold_softmax_logits,
    no_per_task_mode,
    one_micro_batch,
    unscale,
)
from mtl_bench.balancers.validation_source import ValidationSource
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.balancer import task_list
from mtl_bench.gradient_engine.host import host_gramian
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer
from mtl_bench.gradient_engine.solvers import min_norm_simplex
from mtl_bench.gradient_engine.staged import scaled_grad


class MOMLWeighting(LossWeighting):
    """Task logits α (start at 1/T), weights λ = softmax(α); the network descends Σ_i λ_i L_i on its batch,
    and α learns, before each step, how a look-ahead step moves every task's validation loss, each one an
    objective of the upper level (multi-objective, solved by MGDA):

        g_f = [∇_θ L_1(θ); …; ∇_θ L_T(θ)]                 (T × d, every trainable parameter, training batch)
        θ' = θ − η_in λᵀ g_f                              (η_in: `inner_lr`, one plain SGD step)
        g_F,t = ∇_θ' L_t^val(θ'),  a_t = −η_in g_F,t g_fᵀ J_softmax(α)    (∇_α L_t^val(θ'(α)), t = 1..T)
        â_t = a_t / ‖a_t‖,  w = argmin_{w ∈ simplex} ‖Σ_t w_t â_t‖          (MGDA, l2 normalisation)
        α ← Adam(α, Σ_t w_t â_t; lr=outer_lr)

    then Σ_i λ_i(α_new) L_i is backpropagated (LibMTL updates α first, then trains with it).

    Reference: LibMTL main, `Trainer.bacth_forward_MOML` and `Trainer._prepare_tw` in LibMTL/trainer.py (commit
    4336804847eaa5e0b924b743d76beec7ac3fdc97), with the min-norm solver and `l2` normalisers of its
    LibMTL/weighting/MGDA.py. As there: softmax weights, one inner SGD step at its own lr (`inner_lr`; LibMTL
    asserts inner_step == 1 for this "fast" version; the paper's general form unrolls several steps), the α
    gradient of each validation loss exact for that one step (θ' is linear in λ, so ∇_α L_t^val = −η_in g_F,t g_fᵀ J
    with no second derivative), MGDA's Frank-Wolfe from the best pair (exact at T = 2),
    Adam with torch's default betas and eps. Where ours differs (data and arithmetic only, never the update):
    LibMTL draws the inner ("look-ahead") batch, the outer ("validation") batch and the training batch as three
    independent batches of the training data, the first two of half the batch size; here the inner batch is the
    step's training batch itself (g_f comes from the step's own graph: T backwards, no extra forward) and the
    outer batch comes from `validation` (the engine's validation stream, `trainer.validation_source`, a full
    batch). The softmax Jacobian is written out, diag(λ) − λλᵀ (LibMTL asks autograd for it), and the min-norm
    solve runs in float64 on the host (`solvers.min_norm_simplex`, LibMTL's solver in the tensors' dtype): the same
    numbers up to rounding. The look-ahead forward leaves BatchNorm's running statistics alone (LibMTL's runs
    on a deep copy of the model, whose statistics are thrown away: the same).

    An `on_graph` weighting: g_f comes from the step's own losses and their graph, which the engine then backpropagates
    as Σ_i λ_i(α_new) L_i. Needs a validation source (`validation`, given by the engine); one process (the look-ahead
    and the α update are not synchronized across DDP ranks), joint mode, no gradient accumulation (the balancer
    refuses them). Under fp16 the per-task gradients are taken through the grad scaler's scale and divided by it. A
    step whose α update is not finite (a task's α gradient of zero norm, e.g. with one task) trains with the old α and
    keeps it. One host read per step: the T×T Gramian of the normalised α gradients, for the min-norm solver (as
    MGDA).

    Metrics: `weight/<task>` (λ_i used this step). α and Adam's moments are buffers.
    """

    on_graph = True
    HOST_SOLVE = "Frank-Wolfe min-norm on the simplex (numpy)"
    task_names: list[str]
    validation: ValidationSource
    logits: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    opt_step: Tensor

    def __init__(
        self, task_names: Sequence[str], inner_lr: float, outer_lr: float, validation: ValidationSource
    ) -> None:
        """Options as `MOML`'s, checked there; `task_names` in the balancer's (sorted) order."""
        super().__init__()
        self.task_names, self.inner_lr, self.outer_lr = list(task_names), inner_lr, outer_lr
        hold_softmax_logits(self, len(self.task_names), validation)

    def extra_repr(self) -> str:
        return f"inner_lr={self.inner_lr}, outer_lr={self.outer_lr}"

    def forward(  # type: ignore[override]  # an on_graph forward: the losses one by one, the scale, the epoch
        self, losses: Sequence[Tensor], scale: Optional[Tensor] = None, epoch: int = 0
    ) -> Solution:
        """λ(α_new) from the look-ahead on `losses` (the step's, with their graph); α's update as the new state."""
        source = self.validation
        # fp16: gradients through the loss scale, then divided by it (their fp16 backward underflows otherwise).
        trainable = source.trainable_parameters()
        names, params = list(trainable), list(trainable.values())
        alpha = self.logits
        z = torch.softmax(alpha, dim=-1)

        # g_f, per parameter a (T, numel) block, from this step's graph (kept for the real backward).
        g_f = self._per_task_grads(list(losses), params, scale)
        with torch.no_grad():  # the look-ahead θ' = θ − η_in λᵀ g_f
            ahead = {
                n: (p - self.inner_lr * (z @ g).view_as(p)).requires_grad_() for n, p, g in zip(names, params, g_f)
            }

        # g_F: each task's validation gradient at θ'.
        val_inputs, val_targets = source.next_validation_batch()
        outer = source.task_losses(val_inputs, val_targets, ahead)
        g_F = self._per_task_grads([outer[name] for name in self.task_names], list(ahead.values()), scale)

        with torch.no_grad():
            cross = torch.stack([big_f @ f.T for big_f, f in zip(g_F, g_f)]).sum(0)  # (T, T): g_F,t · g_f,j
            jacobian = torch.diag(z) - torch.outer(z, z)  # of softmax at α
            alpha_grads = -self.inner_lr * cross @ jacobian  # row t: ∇_α L_t^val(θ'(α))
            normalized = alpha_grads / alpha_grads.pow(2).sum(-1).sqrt().unsqueeze(1)
            direction = self._min_norm_weights(normalized) @ normalized
            new, exp_avg, exp_avg_sq, step = adam_update(
                alpha, direction, self.exp_avg, self.exp_avg_sq, self.opt_step, self.outer_lr, (0.9, 0.999), 1e-8
            )
            kept = torch.where(torch.isfinite(new).all(), new, alpha)  # a non-finite α: this step trains with the old
        # `new` itself in the state: a non-finite one is not committed (nor are the moments)
        state = {"logits": new, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "opt_step": step}
        return Solution(torch.softmax(kept, dim=-1), state=state)

    @staticmethod
    def _per_task_grads(losses: Sequence[Tensor], params: Sequence[Tensor], scale: Optional[Tensor]) -> list[Tensor]:
        """Each loss's gradient at every parameter (zero where a loss does not reach it), unscaled: one (T, numel)
        block per parameter, as the columns of LibMTL's flattened T × d matrix."""
        blocks = [p.new_zeros(len(losses), p.numel()) for p in params]
        for t, loss in enumerate(losses):
            for block, g in zip(blocks, scaled_grad(loss, params, scale, retain_graph=True, allow_unused=True)):
                if g is not None:
                    block[t] = unscale(g, scale).reshape(-1)
        return blocks

    @staticmethod
    def _min_norm_weights(normalized: Tensor) -> Tensor:
        """MGDA's simplex weights for the rows of `normalized` (NaN when they are not finite: α is then kept)."""
        gram = host_gramian(normalized @ normalized.T)
        t = normalized.shape[0]
        solution = np.full(t, np.nan) if gram is None else min_norm_simplex(gram)
        return torch.as_tensor(solution, dtype=normalized.dtype).to(normalized.device)


class MOML(LossWeightingBalancer):
    """MOML (`MOMLWeighting`) as a balancer: `balancer=moml`."""

    # what must see one batch of every task in one process (for the messages)
    ONE_BATCH_WORK, VALIDATION_WORK, STEP_WORK = "its look-ahead step", "the validation losses", "one look-ahead step"

    def __init__(
        self,
        task_names: Sequence[str],
        inner_lr: float = 0.1,
        outer_lr: float = 1e-3,
        world_size: int = 1,
        validation: Optional[ValidationSource] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        inner_lr: the lr of the one-step SGD look-ahead (> 0; LibMTL's --inner_lr default 0.1).
        outer_lr: the lr of the logits' Adam (> 0; LibMTL's --outer_lr default 1e-3).
        world_size: the number of DDP processes (given by the engine); must be 1.
        validation: the validation batches, task losses and parameters (given by the engine; in your own loop,
            any ValidationSource).
        """
        task_names = task_list(type(self), task_names)  # a mapping is refused first, as by every balancer
        source = bilevel_source(type(self).__name__, world_size, validation, self.ONE_BATCH_WORK)
        inner_lr, outer_lr = number("inner_lr", inner_lr, 0, above=True), number("outer_lr", outer_lr, 0, above=True)
        super().__init__(task_names, MOMLWeighting(sorted(task_names), inner_lr, outer_lr, source))

    def per_task_problem(self) -> str:
        return no_per_task_mode(self, self.ONE_BATCH_WORK, self.VALIDATION_WORK)

    def accumulation_problem(self, steps: int) -> Optional[str]:
        return one_micro_batch(self, steps, self.STEP_WORK)
