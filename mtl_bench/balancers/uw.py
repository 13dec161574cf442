"""Kendall, Gal & Cipolla, CVPR 2018, "Multi-Task Learning Using Uncertainty to Weigh Losses for Scene Geometry
and Semantics"."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.adam_update import adam_update
from mtl_bench.balancers.checks import at_least, number, one_of, pair
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer

OPTIMIZERS = ("adam", "sgd")


class UncertaintyLossWeighting(LossWeighting):
    """Learnable log-variances s_i = log σ_i²: the network trains on Σ_i L_i / (2 e^{s_i}).

    The objective is LibMTL's, Σ_i L_i / (2 e^{s_i}) + s_i / 2: the paper's regression form
    1/(2σ²)·L + log σ, used for every task. The paper's classification form 1/σ²·L + log σ is not used
    (LibMTL neither), and the form e^{-s}L + s found in many repositories is twice this one (the same
    optimum for s, twice its gradient and the network's). The network's gradient is Σ_i w_i ∇L_i with
    w_i = 1/(2 e^{s_i}); the s_i take one step of their own optimizer on ∂/∂s_i = 1/2 − L_i/(2 e^{s_i}),
    in closed form from the detached float32 losses (so it never sees a loss scale and no second
    backward is needed).

    Reference: LibMTL 1.1.5 `LibMTL.weighting.UW` (unchanged on main), s_i starting at −0.5. Difference:
    in LibMTL the s_i are parameters of the model, stepped by the model's optimizer (with its learning
    rate schedule); here the engine's optimizer holds only the model, so the s_i have their own (Adam or
    SGD, constant `lr`, L2 `weight_decay` like torch's). Both agree when these options equal the model
    optimizer's.

    Metrics: `weight/<task>` (w_i used this step), `uw/log_var/<task>` (s_i used this step). Under
    accumulation the update uses the step's mean loss; under DDP the losses are averaged across ranks (by
    name) first, so every rank holds the same s. s and the optimizer's moments are buffers.
    """

    log_vars: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    opt_step: Tensor
    per_task = True  # w_i comes from the committed s_i

    def __init__(
        self,
        task_names: Sequence[str],
        init_log_var: float,
        lr: float,
        optimizer: str,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> None:
        """Options as `UncertaintyWeighting`'s, checked there; `task_names` in the balancer's (sorted) order."""
        super().__init__()
        self.task_names, self.init_log_var, self.lr, self.optimizer = list(task_names), init_log_var, lr, optimizer
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        n = len(self.task_names)
        self.register_buffer("log_vars", torch.full((n,), init_log_var))
        self.register_buffer("exp_avg", torch.zeros(n))
        self.register_buffer("exp_avg_sq", torch.zeros(n))
        self.register_buffer("opt_step", torch.zeros(()))

    def extra_repr(self) -> str:
        return f"lr={self.lr}, optimizer={self.optimizer}"

    @property
    def weights(self) -> Tensor:
        """w_i = 1 / (2 e^{s_i}) from the committed log-variances."""
        return 0.5 * torch.exp(-self.log_vars)

    def forward(self, losses: Tensor) -> Solution:
        log_vars = self.log_vars.clone()  # this step's (the buffer takes the update at the commit)
        return Solution(self.weights, metrics={f"uw/log_var/{n}": log_vars[i] for i, n in enumerate(self.task_names)})

    def update(self, losses: Tensor, items: Tensor) -> dict[str, Tensor]:
        """One optimizer step of s on the step's (rank-averaged, micro-batch-averaged) losses."""
        s = self.log_vars
        grad = 0.5 - 0.5 * losses * torch.exp(-s)
        if self.weight_decay:
            grad = grad + self.weight_decay * s
        if self.optimizer == "sgd":
            return {"log_vars": s - self.lr * grad}
        new, exp_avg, exp_avg_sq, step = adam_update(
            s, grad, self.exp_avg, self.exp_avg_sq, self.opt_step, self.lr, self.betas, self.eps
        )
        return {"log_vars": new, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "opt_step": step}


class UncertaintyWeighting(LossWeightingBalancer):
    """UW (`UncertaintyLossWeighting`) as a balancer: `balancer=uw`."""

    def __init__(
        self,
        task_names: Sequence[str],
        init_log_var: float = -0.5,
        lr: float = 1e-3,
        optimizer: str = "adam",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        init_log_var: the initial s_i = log σ_i² of every task (LibMTL: -0.5).
        lr: the learning rate of the log-variances' own optimizer (> 0).
        optimizer: the log-variances' optimizer: adam or sgd.
        betas: Adam's betas for the log-variances, each in [0, 1).
        eps: Adam's eps for the log-variances (> 0).
        weight_decay: L2 penalty on the log-variances, added to their gradient as torch's optimizers do (>= 0).
        """
        weighting = UncertaintyLossWeighting(
            sorted(task_names),
            number("init_log_var", init_log_var, finite=True),
            number("lr", lr, 0, above=True),
            one_of("optimizer", optimizer, OPTIMIZERS),
            pair("betas", betas, 0, 1, below=True),
            number("eps", eps, 0, above=True),
            at_least("weight_decay", weight_decay, 0),
        )
        super().__init__(task_names, weighting)
