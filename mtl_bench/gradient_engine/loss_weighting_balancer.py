"""A loss weighting as a balancer: one backward of Σ_i w_i L_i with w from the method's `LossWeighting`."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.loss_weighting import GraphSolution, LossWeighting
from mtl_bench.balancers.weighting import as_solution
from mtl_bench.errors import ContractError
from mtl_bench.gradient_engine.balancer import BackwardContext, Balancer, Context, refuse_flat_state
from mtl_bench.gradient_engine.rank_average import average_by_name
from mtl_bench.gradient_engine.staged import JOINT, PER_TASK, StagedBalancer


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


def batch_items(shared: Tensor) -> Tensor:
    """The examples in a batch, from the first dimension of its shared representation (1 when it is 0-d), as a 0-d
    float32 on its device (a fill there, not a host-to-device copy, which would wait for the stream)."""
    return shared.new_full((), float(shared.shape[0]) if shared.dim() > 0 else 1.0, dtype=torch.float32)


class LossWeightingBalancer(StagedBalancer):
    """Trains on Σ_i w_i L_i with w = weighting(L) (the contract: mtl_bench/balancers/loss_weighting.py).

    The weights are computed on the detached losses (float32) and one backward runs through the loss scale, so AMP
    changes nothing. Under DDP the losses are averaged across ranks (by name) first, so every rank uses the weights
    of the global batch and holds the same state. Under gradient accumulation a stateless weighting weights each
    micro-batch by its own losses; one with state (an `update`) by the mean of the step's losses so far (by its own
    with `step_mean = False`), and its update sees the whole step's. A weighting whose w_i depends on L_i alone
    (`per_task`) also runs per-task steps; its update then runs at `step()`, from every task's losses. A method of
    mtl-bench is a subclass whose constructor, written in the method's file, builds its weighting; its state is saved
    under `weighting.`. An `on_graph` weighting (a bilevel method) gets this micro-batch's own losses with their graph
    and the loss scale, and returns its new state with its weights; its host solve (`HOST_SOLVE`) runs in `backward`.

    Metrics: `weight/<task>`, and the weighting's.
    """

    weighting: LossWeighting
    HOST_SOLVE_IN = "backward"  # where the weighting's forward (and its host solve) runs

    def __init__(self, task_names: Sequence[str], weighting: LossWeighting) -> None:
        super().__init__(task_names)
        if weighting.on_graph and weighting.stateful:
            raise ContractError(
                f"{type(weighting).__name__}: an on_graph weighting returns its new state in its forward's Solution; "
                "it has no update"
            )
        self.weighting = weighting
        self.stateful = weighting.stateful
        self.HOST_SOLVE = weighting.HOST_SOLVE

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: object) -> None:
        refuse_flat_state(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _rank_mean(self, **stats: Tensor) -> list[Tensor]:
        """Each (T,) statistic (Σ items·L, items, L) averaged over the ranks by name (one collective), in task order;
        each rank's own where the weighting does not read its losses."""
        if not self.weighting.reads_losses:
            return list(stats.values())
        names = self.task_names
        mean = average_by_name({f"{key}/{n}": value[i] for key, value in stats.items() for i, n in enumerate(names)})
        return [torch.stack([mean[f"{key}/{n}"] for n in names]) for key in stats]

    def _losses_for_weights(self, losses: dict[str, Tensor]) -> Tensor:
        """What a stateless forward gets: the losses averaged over the ranks, or each rank's own (detached) where
        the weighting does not read them."""
        if self.weighting.reads_losses:
            return rank_mean_losses(losses)
        return torch.stack([loss.detach().float() for loss in losses.values()])

    def _stage_update(self, losses: Tensor, items: Tensor) -> None:
        """Stage the weighting's next state from the step's losses (kept only if they are finite)."""
        self._require_finite(losses)
        self._stage(**{f"weighting.{name}": value for name, value in self.weighting.update(losses, items).items()})

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        self.check_losses(losses)
        ordered = {name: losses[name] for name in self.task_names}
        if self.weighting.on_graph:
            return self._backward_on_graph(ordered, shared, ctx)
        if not self.stateful:
            solution = as_solution(self.weighting(self._losses_for_weights(ordered)))
            return weighted_backward(self, ordered, solution.weights, ctx) | solution.metrics
        self._begin(JOINT, ctx, shared)
        items = batch_items(shared).expand(len(self.task_names))
        local = torch.stack([loss.detach().float() for loss in ordered.values()])
        own = {} if self.weighting.step_mean else {"loss": local}  # this micro-batch's, in the same collective
        weighted, items, *rest = self._rank_mean(weighted=local * items, items=items, **own)
        weighted, items = self._mean("weighted", weighted), self._mean("items", items)
        step_losses = weighted / items  # the step's so far: the micro-batches' item-weighted mean
        solution = as_solution(self.weighting(rest[0] if rest else step_losses))
        if self._sums["items"][1] == (self._ctx.accumulation_steps if self._ctx is not None else 1):
            self._stage_update(step_losses, items)
        metrics = weighted_backward(self, ordered, solution.weights, ctx) | solution.metrics
        self._end_joint()
        return metrics

    def _backward_on_graph(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context) -> dict[str, Tensor]:
        """The weighting differentiates this micro-batch's own losses (their graph kept for the backward here); the
        state in its Solution is staged (kept only if finite), then one backward of Σ_i w_i L_i or of its objective."""
        self._begin(JOINT, ctx, shared)
        context = BackwardContext.of(ctx)
        # at least float32 (a float64 loss stays float64): a half-precision loss enters the sums as float32
        own = tuple(loss.to(torch.promote_types(loss.dtype, torch.float32)) for loss in losses.values())
        result = self.weighting(own, self._loss_scale, context.epoch if context is not None else 0)
        objective = result.objective if isinstance(result, GraphSolution) else None
        solution = result.solution if isinstance(result, GraphSolution) else as_solution(result)
        if solution.state:
            self._require_finite(*solution.state.values())
            self._stage(**{f"weighting.{name}": value for name, value in solution.state.items()})
        self.run_backward((solution.weights * torch.stack(own)).sum() if objective is None else objective, ctx)
        self._end_joint()
        return {tags.weight(name): solution.weights[i] for i, name in enumerate(losses)} | solution.metrics

    def per_task_problem(self) -> Optional[str]:
        if self.weighting.on_graph:
            return (
                f"{type(self).__name__} has no per-task mode: its weighting differentiates every task's loss of the "
                "same batch; use trainer.step_mode=joint"
            )
        return None if self.weighting.per_task else no_per_task_mode(self)

    def backward_task(self, task: str, loss: Tensor, shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        problem = self.per_task_problem()
        if problem is not None:
            raise NotImplementedError(problem)
        if task not in self._index:
            raise KeyError(f"task {task!r} is not one of the balancer's tasks {self.task_names}")
        if self.stateful:  # the update waits for every task's losses, at step()
            self._begin(PER_TASK, ctx, shared)
            items = batch_items(shared)
            self._collect(task, weighted=loss.detach().float() * items, items=items)
        own = self._losses_for_weights({task: loss})[0]
        solution = as_solution(self.weighting(own.expand(len(self.task_names))))
        weight = solution.weights[self._index[task]]
        self.run_backward(weight * loss.float(), ctx)
        return {tags.weight(task): weight} | {k: v for k, v in solution.metrics.items() if k.endswith(f"/{task}")}

    def _finish(self) -> dict[str, Tensor]:
        stats = [self._collected[name] for name in self.task_names]
        weighted, items = self._rank_mean(
            weighted=torch.stack([s["weighted"] for s in stats]), items=torch.stack([s["items"] for s in stats])
        )
        self._stage_update(weighted / items, items)
        return {}
