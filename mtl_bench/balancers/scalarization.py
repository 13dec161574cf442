"""The base of the loss-level methods that train on a fixed function f(L_1, ..., L_T) of the task losses
(SI, GLS, STCH, COSMOS, PBI): one backward of Σ_i w_i L_i with w = ∂f/∂L at this step's losses."""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.checks import number, task_weights
from mtl_bench.gradient_engine.balancer import Balancer, Context
from mtl_bench.gradient_engine.rank_average import average_by_name


def preference_vector(weights: Optional[Mapping[str, float]], task_names: Sequence[str]) -> Tensor:
    """A preference vector in task order: None gives 1/T each (the simplex's centre), else the given weights."""
    if weights is None:
        return torch.full((len(task_names),), 1.0 / len(task_names))
    try:
        values = task_weights(weights, list(task_names))
    except ValueError as error:  # its message names `weights`; here the option is `preference`
        raise ValueError(f"preference{str(error).removeprefix('weights')}") from None
    if not sum(values.values()) > 0:
        raise ValueError(f"preference: at least one weight must be > 0, got {dict(weights)}")
    return torch.tensor([values[name] for name in task_names], dtype=torch.float32)


def reference_point(point: Optional[Mapping[str, float]], task_names: Sequence[str]) -> Tensor:
    """A reference (ideal) point in task order: None gives 0 each; every task needs one finite number."""
    if point is None:
        return torch.zeros(len(task_names))
    if set(point) != set(task_names):
        raise ValueError(f"reference: tasks {sorted(point)} do not match the task set's tasks {list(task_names)}")
    values = {name: number(f"reference.{name}", value, finite=True) for name, value in point.items()}
    return torch.tensor([values[name] for name in task_names], dtype=torch.float32)


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


class ScalarizedBalancer(Balancer):
    """Trains on f(L) for a method's objective `_objective(L)` (a differentiable 0-d tensor of the (T,) losses).

    The network's gradient is ∇f(L) = Σ_i w_i ∇L_i with w = ∂f/∂L: the weights are computed on the detached
    losses (float32) and one backward of Σ_i w_i L_i runs through the loss scale, so AMP changes nothing.
    Under DDP the losses are averaged across ranks (by name) before w is computed, so every rank uses the
    weights of the global batch and DDP's gradient average gives ∇f of the global batch's losses. Under
    gradient accumulation each micro-batch's weights come from its own losses (the step's gradient is the
    mean over the micro-batches of ∇f). A method whose weight of L_i depends on L_i alone (`PER_TASK`)
    also runs per-task steps; the others need every task's loss of the same batch.

    Metrics: `weight/<task>` (w_i = ∂f/∂L_i).
    """

    PER_TASK = False

    def _objective(self, losses: Tensor) -> Tensor:
        raise NotImplementedError

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        self.check_losses(losses)
        ordered = {name: losses[name] for name in self.task_names}
        return weighted_backward(self, ordered, objective_weights(self._objective, rank_mean_losses(ordered)), ctx)

    def per_task_problem(self) -> Optional[str]:
        return None if self.PER_TASK else no_per_task_mode(self)

    def backward_task(self, task: str, loss: Tensor, shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        problem = self.per_task_problem()
        if problem is not None:
            raise NotImplementedError(problem)
        if task not in self.task_names:
            raise KeyError(f"task {task!r} is not one of the balancer's tasks {self.task_names}")
        weight = self._task_weight(task, rank_mean_losses({task: loss})[0])
        self.run_backward(weight * loss.float(), ctx)
        return {tags.weight(task): weight}

    def _task_weight(self, task: str, loss: Tensor) -> Tensor:
        """Per-task mode (`PER_TASK` methods): ∂f/∂L_task from the task's own (detached) loss."""
        raise NotImplementedError
