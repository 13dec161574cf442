"""Liu, Johns & Davison, TMLR 2022, "Auto-Lambda: Disentangling Dynamic Task Relationships"."""

from __future__ import annotations

from typing import Optional, Sequence

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
    stacked,
    unscale,
)
from mtl_bench.balancers.validation_source import ValidationSource
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.balancer import task_list
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer
from mtl_bench.gradient_engine.staged import scaled_grad


class AutoLambdaWeighting(LossWeighting):
    """Task logits α (start at 1/T), weights λ = softmax(α); the network descends Σ_i λ_i L_i on its batch,
    and α learns, before each step, what a look-ahead step would do to the validation loss Σ_i L_i^val:

        θ' = θ − η ∇_θ Σ_i λ_i L_i(θ)                   (η: the optimizer's current lr, plain SGD)
        d = ∇_θ' Σ_i L_i^val(θ'),  ε = 0.01 / ‖d‖
        h = (∇_α Σ_i λ_i L_i(θ + ε d) − ∇_α Σ_i λ_i L_i(θ − ε d)) / (2ε)   (finite differences, DARTS)
        α ← Adam(α, −η h; lr=outer_lr)

    then Σ_i λ_i(α_new) L_i is backpropagated (LibMTL updates α first, then trains with it).

    Reference: LibMTL main, `Trainer.bacth_forward_AutoLambda` and `Trainer._prepare_tw` in
    LibMTL/trainer.py (commit 4336804847eaa5e0b924b743d76beec7ac3fdc97), itself adapted from the authors'
    lorenmt/auto-lambda. As there: softmax weights (the paper's λ are unconstrained), outer loss the sum of
    every task's loss (the paper's "all tasks" setting), a look-ahead step of plain SGD at the first param
    group's lr (the authors' code also applies the optimizer's momentum and weight decay), Adam with torch's
    default betas and eps. Where ours differs (data only, never the update): LibMTL draws the look-ahead
    ("inner") batch, the validation ("outer") batch and the training batch as three independent batches of
    the training data, the first two of half the batch size; here the look-ahead batch is the step's training
    batch itself (as in the authors' code, which saves a forward and a backward: ∇_θ Σ λ_i L_i comes from the
    step's own graph) and the validation batch comes from `validation` (the engine's validation stream,
    `trainer.validation_source`, a full batch). The look-ahead forwards leave BatchNorm's running statistics
    alone (LibMTL's ±ε forwards run on the live model and update them; they do not change the update).

    An `on_graph` weighting: it takes the look-ahead gradient from the step's own losses and their graph, which the
    engine then backpropagates as Σ_i λ_i(α_new) L_i. Needs a validation source (`validation`, given by the engine);
    one process (the look-ahead is not synchronized across DDP ranks), joint mode, no gradient accumulation (the
    balancer refuses them). Under fp16 the look-ahead gradients are taken through the grad scaler's scale and divided
    by it. A step whose α update is not finite trains with the old α and keeps it.

    Metrics: `weight/<task>` (λ_i used this step). α and Adam's moments are buffers.
    """

    on_graph = True
    task_names: list[str]
    validation: ValidationSource
    logits: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    opt_step: Tensor

    def __init__(self, task_names: Sequence[str], outer_lr: float, validation: ValidationSource) -> None:
        """Options as `AutoLambda`'s, checked there; `task_names` in the balancer's (sorted) order."""
        super().__init__()
        self.task_names, self.outer_lr = list(task_names), outer_lr
        hold_softmax_logits(self, len(self.task_names), validation)

    def extra_repr(self) -> str:
        return f"outer_lr={self.outer_lr}"

    def forward(  # type: ignore[override]  # an on_graph forward: the losses one by one, the scale, the epoch
        self, losses: Sequence[Tensor], scale: Optional[Tensor] = None, epoch: int = 0
    ) -> Solution:
        """λ(α_new) from the look-ahead on `losses` (the step's, with their graph); α's update as the new state."""
        source = self.validation
        # fp16: gradients through the loss scale, then divided by it (their fp16 backward underflows otherwise).
        trainable = source.trainable_parameters()
        names, params = list(trainable), list(trainable.values())
        alpha = self.logits
        lr = source.learning_rate()

        # The look-ahead step θ' = θ − η ∇_θ Σ λ_i L_i, from this step's graph (kept for the real backward).
        inner = (torch.softmax(alpha, dim=-1) * torch.stack(list(losses))).sum()
        grads = scaled_grad(inner, params, scale, retain_graph=True, allow_unused=True)
        with torch.no_grad():
            ahead = {
                n: (p - lr * unscale(g, scale) if g is not None else p.clone()).requires_grad_()
                for n, p, g in zip(names, params, grads)
            }

        # d = ∇_θ' of the validation loss at θ'.
        val_inputs, val_targets = source.next_validation_batch()
        outer = stacked(self.task_names, source.task_losses(val_inputs, val_targets, ahead)).sum()
        outer = outer * scale if scale is not None else outer
        found = torch.autograd.grad(outer, list(ahead.values()), allow_unused=True)
        d = [unscale(g, scale) if g is not None else torch.zeros_like(p) for g, p in zip(found, params)]

        # ∇²_{α,θ} Σ λ_i L_i · d by central differences at θ ± ε d on the training batch.
        eps = 0.01 / torch.linalg.vector_norm(torch.stack(torch._foreach_norm(d)))
        inputs, targets = source.training_batch()
        with torch.no_grad():
            plus = {n: p + eps * g for n, p, g in zip(names, params, d)}
            minus = {n: p - eps * g for n, p, g in zip(names, params, d)}
            at_plus = stacked(self.task_names, source.task_losses(inputs, targets, plus))
            at_minus = stacked(self.task_names, source.task_losses(inputs, targets, minus))
            z = torch.softmax(alpha, dim=-1)
            # ∇_α Σ softmax(α)_i L_i = z ∘ (L − z·L): the softmax's backward, as autograd computes it.
            hessian = (z * (at_plus - (z * at_plus).sum()) - z * (at_minus - (z * at_minus).sum())) / (2 * eps)
            new, exp_avg, exp_avg_sq, step = adam_update(
                alpha, -lr * hessian, self.exp_avg, self.exp_avg_sq, self.opt_step, self.outer_lr, (0.9, 0.999), 1e-8
            )
            kept = torch.where(torch.isfinite(new).all(), new, alpha)  # a non-finite α: this step trains with the old
        # `new` itself in the state: a non-finite one is not committed (nor are the moments)
        state = {"logits": new, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "opt_step": step}
        return Solution(torch.softmax(kept, dim=-1), state=state)


class AutoLambda(LossWeightingBalancer):
    """Auto-λ (`AutoLambdaWeighting`) as a balancer: `balancer=auto_lambda`."""

    # what must see one batch of every task in one process (for the messages)
    ONE_BATCH_WORK, VALIDATION_WORK, STEP_WORK = "its look-ahead step", "the validation loss", "one look-ahead step"

    def __init__(
        self,
        task_names: Sequence[str],
        outer_lr: float = 1e-3,
        world_size: int = 1,
        validation: Optional[ValidationSource] = None,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        outer_lr: the lr of the logits' Adam (> 0; LibMTL's --outer_lr default 1e-3).
        world_size: the number of DDP processes (given by the engine); must be 1.
        validation: the training batch, validation batches, task losses, parameters and lr (given by the engine;
            in your own loop, any ValidationSource).
        """
        task_names = task_list(type(self), task_names)  # a mapping is refused first, as by every balancer
        source = bilevel_source(type(self).__name__, world_size, validation, self.ONE_BATCH_WORK)
        outer_lr = number("outer_lr", outer_lr, 0, above=True)
        super().__init__(task_names, AutoLambdaWeighting(sorted(task_names), outer_lr, source))

    def per_task_problem(self) -> str:
        return no_per_task_mode(self, self.ONE_BATCH_WORK, self.VALIDATION_WORK)

    def accumulation_problem(self, steps: int) -> Optional[str]:
        return one_micro_batch(self, steps, self.STEP_WORK)
