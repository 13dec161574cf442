"""An aggregator as a balancer: the direction an `Aggregator` makes of the gradient blocks, written to `.grad`."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Literal, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.aggregator import Aggregation, Aggregator, StepInfo
from mtl_bench.balancers.weighting import check_solution
from mtl_bench.errors import ContractError
from mtl_bench.gradient_engine.balancer import BackwardContext, Context, refuse_flat_state
from mtl_bench.gradient_engine.gradient_balancer import GradientBalancer
from mtl_bench.gradient_engine.gramian import gram_metrics
from mtl_bench.gradient_engine.leaf_grads import GradientShapeError, leaf_grads_root, write_leaf_grads
from mtl_bench.gradient_engine.rank_average import world_size
from mtl_bench.gradient_engine.staged import JOINT
from mtl_bench.gradient_engine.task_grads import task_gradients

PREFIX = "aggregator."


class AggregatorBalancer(GradientBalancer):
    """d = aggregator(J) at the shared parameters or the shared representation (the contract:
    mtl_bench/balancers/aggregator.py).

    The gradient engine (`GradientBalancer`) does the rest: the per-task gradients, the loss scale, accumulation,
    per-task steps, the heads (weight 1, or the solution's head weights for an aggregator that `weighs_heads`).
    `grad_source` as there: shared_params (J at the shared parameters, the direction into their `.grad`) or
    shared_rep (one block, the gradients at the representation; the direction goes back through the trunk). A method
    of mtl-bench is a subclass whose constructor, written in the method's file, builds its aggregator; its state is
    saved under `aggregator.`. `grad_norm/` and `grad_cos/` come from the Gramian, computed only at steps whose
    measurements are read (`BackwardContext.measure`).

    An aggregator with `forward_rows` gets J row by row, each task's gradient as its backward returns it (no T×P
    copy into J), on one process in a joint step of one micro-batch with shared_params; elsewhere (DDP, which may
    average J; accumulation, which sums it; per-task steps) `forward` gets the blocks. An aggregator's `objective`
    replaces each loss before any backward (joint and per task); `reads_step` and `measures_gradients` as there.
    """

    aggregator: Aggregator

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]],
        aggregator: Aggregator,
        grad_source: Literal["shared_params", "shared_rep"] = "shared_params",
    ) -> None:
        super().__init__(task_names, shared_params, grad_source, gramian_kernel=not aggregator.measures_gradients)
        if aggregator.reads_representation and grad_source != "shared_rep":
            raise ValueError(
                f"grad_source: {type(aggregator).__name__} reads the shared representation; it needs shared_rep"
            )
        self.aggregator = aggregator
        self.heads_wait = aggregator.weighs_heads
        self._streams = type(aggregator).forward_rows is not Aggregator.forward_rows
        self._transforms = type(aggregator).objective is not Aggregator.objective
        self._streamed = 0  # rows the aggregator has read in this step (forward_rows)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        refuse_flat_state(self, state_dict, prefix, "aggregator")
        super()._load_from_state_dict(state_dict, prefix, *args)

    def aggregate(
        self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor, shared: Optional[Tensor]
    ) -> dict[str, Tensor]:
        if self.aggregator.reads_representation:
            assert shared is not None  # shared_rep (checked in __init__)
            result = self.aggregator(blocks, scale, losses, shared.detach(), **self._step_info(blocks=True))
        else:
            result = self.aggregator(blocks, scale, losses, **self._step_info(blocks=True))
        return self._take(result, blocks, scale, [], shared, blocks)

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        """The engine's backward, or for an aggregator with `forward_rows` on one process in a step of one
        micro-batch, J streamed to it row by row (see the class docstring)."""
        if self._transforms:
            self.check_losses(losses)
            losses = {name: self.aggregator.objective(losses[name]) for name in self.task_names}
        context = BackwardContext.of(ctx)
        one_batch = context is None or context.accumulation_steps == 1
        if not (self._streams and self.grad_source == "shared_params" and one_batch and world_size() == 1):
            return super().backward(losses, shared, ctx)
        self.check_losses(losses)
        scale = self._begin(JOINT, ctx, shared)
        ordered = [losses[name] for name in self.task_names]
        loss_values = self._mean("losses", torch.stack([loss.detach().float() for loss in ordered]))
        heads: list[tuple[Tensor, Tensor]] = []
        kept: list[list[Tensor]] = []  # the rows, for the Gramian of a measured step
        self._streamed = 0
        rows = self._rows(ordered, shared, scale, heads, kept)
        result = self.aggregator.forward_rows(rows, scale, loss_values, **self._step_info(blocks=False))
        if self._streamed != len(ordered):
            raise ContractError(
                f"{self.part_name}: forward_rows read {self._streamed} of {len(ordered)} rows; the contract: every "
                "row, in order"
            )
        measured = [torch.stack(pieces) for pieces in zip(*kept)] if kept else None
        metrics = self._take(result, self._params, scale, heads, None, measured)
        self._end_joint()
        return metrics

    def backward_task(self, task: str, loss: Tensor, shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        if self._transforms:
            loss = self.aggregator.objective(loss)
        return super().backward_task(task, loss, shared, ctx)

    def _step_info(self, blocks: bool) -> dict[str, StepInfo]:
        """`step` for an aggregator that `reads_step`: the blocks sum the step's backwards at the shared parameters
        (k micro-batches); with shared_rep, and for rows, one."""
        if not self.aggregator.reads_step:
            return {}
        k = self._steps() if blocks and self.grad_source == "shared_params" else 1
        return {"step": StepInfo(k, self.measuring)}

    def _rows(
        self,
        ordered: list[Tensor],
        shared: Tensor,
        scale: Optional[Tensor],
        heads: list[tuple[Tensor, Tensor]],
        kept: list[list[Tensor]],
    ) -> Iterator[list[Tensor]]:
        """Task by task, its gradients at the shared parameters (zeros where it does not reach one); its heads'
        gradients are added to `heads` (or held for the solution's head weights)."""
        for i, (grads, own) in enumerate(task_gradients(ordered, shared, self._params, scale, self._param_ids)):
            heads += self._heads([own], [i])
            row = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, self._params)]
            if self.measuring and not self.aggregator.measures_gradients:  # grad_cos: every pair of this batch's
                kept.append(row)
            self._streamed += 1
            yield row

    def _take(
        self,
        result: Aggregation,
        like: Sequence[Tensor],
        scale: Optional[Tensor],
        heads: list[tuple[Tensor, Tensor]],
        shared: Optional[Tensor],
        measured: Optional[list[Tensor]],
    ) -> dict[str, Tensor]:
        """Hold `result` to the contract, stage its state, write its direction with the heads' gradients (`heads`,
        and those held for its head weights) and return the step's measurements (the Gramian's of `measured`,
        the blocks, when measuring). `like`: one tensor per block (its direction's device is the weights')."""
        if not isinstance(result, Aggregation) or len(result.direction) != len(like):
            raise ContractError(
                f"{self.part_name} returned {type(result).__name__}; the contract: an Aggregation with one direction "
                f"per block ({len(like)})"
            )
        solution = result.solution
        check_solution(solution, len(self.task_names), None, like[0], self.part_name)
        if solution.state:
            self._stage(**{PREFIX + name: value for name, value in solution.state.items()})
        if result.stats:
            self._require_finite(*result.stats)
        if self._finite is not None:  # the inputs were finite: NaN weights are the method's
            self.nonfinite_weights = self._finite & ~torch.isfinite(solution.weights).all()
        weights = solution.head_weights
        heads += [(p, g * weights[i].to(g.dtype) if weights is not None else g) for i, p, g in self._held]
        self._held = []
        try:
            if shared is not None:  # shared_rep: the direction at the representation goes back through the trunk
                (direction,) = result.direction
                roots = [leaf_grads_root(heads)] if heads else []
                torch.autograd.backward([shared, *roots], [direction.to(shared.dtype), *[None] * len(roots)])
            else:  # handed over: autograd keeps them as `.grad` without a copy where nothing else holds them
                pairs, result.direction = [*zip(self._params, self._own(result.direction, like)), *heads], []
                heads.clear()
                write_leaf_grads(pairs)
        except GradientShapeError as err:
            raise ContractError(f"{self.part_name} wrote {err}") from None
        metrics = {tags.weight(n): v for n, v in zip(self.task_names, solution.weights.unbind())}
        if measured is not None and self.measuring and not self.aggregator.measures_gradients:
            metrics.update(gram_metrics(self._unscaled_gramian(measured, scale), self.task_names))
        metrics.update(solution.metrics)
        return metrics

    def _own(self, directions: list[Tensor], blocks: Sequence[Tensor]) -> list[Tensor]:
        """The directions as `.grad` may keep them: one that shares memory with a block (J is rewritten by the next
        step) or with the aggregator's state is copied; the others (made for this step) are handed over as they are."""
        spares = self.aggregator.__dict__.get("_spares", {}).values()
        kept = {t.untyped_storage().data_ptr() for t in [*blocks, *self.aggregator.buffers(), *spares]}
        return [d.clone() if d.untyped_storage().data_ptr() in kept else d for d in directions]
