"""A loss weighting as a balancer: one backward of Σ_i w_i L_i with w from the method's `LossWeighting`."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.weighting import as_solution
from mtl_bench.gradient_engine.balancer import Balancer, Context, refuse_flat_state
from mtl_bench.gradient_engine.rank_average import average_by_name
from mtl_bench.gradient_engine.staged import JOINT, StagedBalancer


def objective_weights(objective: Callable[[Tensor], Tensor], losses: Tensor) -> Tensor:
    """w = ∂f/∂L of a scalarization f at the (detached, float32) losses."""
    with torch.enable_grad():
        at = losses.detach().float().requires_grad_(True)
        (weights,) = torch.autograd.grad(objective(at), at)
    return weights


def rank_mean_losses(losses: dict[str, Tensor]) -> Tensor:
    """The detached losses in the mapping's order, averaged across DDP ranks by name (the global batch's losses)."""
    mean = average_by_name({tags.loss(name): loss.detach().float() for name, loss in losses.items()})
    return torch.stack([mean[tags.loss(name)] for name in losses])


def weighted_backward(
    balancer: Balancer, losses: dict[str, Tensor], weights: Tensor, ctx: Context
) -> dict[str, Tensor]:
    """One backward of Σ_i w_i L_i (losses in the balancer's task order) through the loss scale; `weight/<task>`."""
    stacked = torch.stack([loss.float() for loss in losses.values()])
    balancer.run_backward((weights * stacked).sum(), ctx)
    return {tags.weight(name): weights[i] for i, name in enumerate(losses)}


def no_per_task_mode(balancer: Balancer) -> str:
    return (
        f"{type(balancer).__name__} has no per-task mode: each task's weight ∂f/∂L_i depends on every "
        "task's loss of the same batch; use trainer.step_mode=joint"
    )


class LossWeightingBalancer(StagedBalancer):
    """Trains on Σ_i w_i L_i with w = weighting(L) (the contract: mtl_bench/balancers/loss_weighting.py).

    The weights are computed on the detached losses (float32) and one backward runs through the loss scale, so AMP
    changes nothing. Under DDP the losses are averaged across ranks (by name) first, so every rank uses the weights
    of the global batch. Under gradient accumulation each micro-batch's weights come from its own losses. A
    weighting whose w_i depends on L_i alone (`per_task`) also runs per-task steps. A method of mtl-bench is a
    subclass whose constructor, written in the method's file, builds its weighting; its state is saved under
    `weighting.`.

    Metrics: `weight/<task>`, and the weighting's.
    """

    weighting: LossWeighting

    def __init__(self, task_names: Sequence[str], weighting: LossWeighting) -> None:
        super().__init__(task_names)
        self.weighting = weighting

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: object) -> None:
        refuse_flat_state(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        self.check_losses(losses)
        ordered = {name: losses[name] for name in self.task_names}
        solution = as_solution(self.weighting(rank_mean_losses(ordered)))
        if not solution.state:
            return weighted_backward(self, ordered, solution.weights, ctx) | solution.metrics
        self._begin(JOINT, ctx, shared)
        self._stage(**{f"weighting.{name}": value for name, value in solution.state.items()})
        metrics = weighted_backward(self, ordered, solution.weights, ctx) | solution.metrics
        self._end_joint()
        return metrics

    def per_task_problem(self) -> Optional[str]:
        return None if self.weighting.per_task else no_per_task_mode(self)

    def backward_task(self, task: str, loss: Tensor, shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        problem = self.per_task_problem()
        if problem is not None:
            raise NotImplementedError(problem)
        if task not in self._index:
            raise KeyError(f"task {task!r} is not one of the balancer's tasks {self.task_names}")
        own = rank_mean_losses({task: loss})[0]
        weight = as_solution(self.weighting(own.expand(len(self.task_names)))).weights[self._index[task]]
        self.run_backward(weight * loss.float(), ctx)
        return {tags.weight(task): weight}
