"""The contract of a gradient method that needs the gradients themselves (per coordinate, not only their Gramian):
an aggregator, the shared direction from the tasks' gradient blocks (and losses, and its own state).

The engine (`gradient_engine.aggregator_balancer.AggregatorBalancer`) gathers the per-task gradients at the shared
parameters (or at the shared representation) and writes the direction into `.grad` (or back through the trunk); an
aggregator only turns J into the direction. A complete one:

    class Mean(Aggregator):
        def forward(self, blocks, scale, losses):
            t = blocks[0].shape[0]
            return Aggregation([block.mean(0) for block in blocks], Solution(torch.full((t,), 1 / t)))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

from torch import Tensor, nn

from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.staged import staging_buffer


@dataclass
class Aggregation:
    """What an aggregator returns: the direction, one tensor per block shaped like its parameter (`block.shape[1:]`)
    and scaled as the blocks are (made for this step, it becomes `.grad` as it is; one that shares memory with a
    block or with the aggregator's state is copied first), and a `Solution` whose (T,) weights are logged as
    `weight/<task>` (each task's share of the direction), with the heads' weights (read when the aggregator
    `weighs_heads`), its measurements and the new values of its buffers (committed at the balancer's `step()` unless
    it is skipped).

    `stats`: a few values the new state was computed from (per-task norms, the losses), whose finiteness stands for
    the gradients': where one is not finite the state is not committed (J itself is not checked: a pass over T×P).
    Under DDP give the rank-averaged ones, so that every rank decides alike."""

    direction: list[Tensor]
    solution: Solution
    stats: list[Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class StepInfo:
    """What an aggregator that `reads_step` is told about the step: `micro_batches`, how many backwards' gradients
    the blocks sum (k under accumulation, each taken with its own factor; 1 for rows), and `measure`, whether this
    step's measurements are read (`BackwardContext.measure`)."""

    micro_batches: int
    measure: bool


class Aggregator(nn.Module):
    """A gradient method: `forward(blocks, scale, losses)` returns an `Aggregation`.

    `blocks`: J as one (T, *p.shape) block per shared parameter (`gradient_engine.blocks.flat_rows` views one as
    (T, P) without a copy), or with grad_source=shared_rep one (T, *shared.shape) block of the gradients at the shared
    representation; the gradients of the scaled losses (`scale`: the loss scale, None without one: divide by it where
    the method is not homogeneous), summed over the step's micro-batches, this process's (average them with
    `gradient_engine.rank_average.rank_mean` where the method needs the global batch's). `losses`: (T,) the step's
    mean losses. Rows follow `task_names` sorted. The heads get their own gradients (weight 1, or the solution's
    `head_weights` when `weighs_heads`).

    Class attributes ask the engine for more: `weighs_heads` (the heads' gradients wait for the solution's
    `head_weights`), `reads_representation` (with grad_source=shared_rep: `forward` also gets the representation's
    values, detached, as `shared`: GradDrop's signs), `reads_step` (`forward` and `forward_rows` also get `step`, a
    `StepInfo`: a method whose state averages the step's gradients) and `measures_gradients` (the engine adds no
    `grad_norm/` or `grad_cos/` of its own, keeps no rows for them and builds no Gramian kernel ahead: the
    aggregator's metrics give them when `step.measure`). An aggregator that overrides `objective` has each task's
    loss L_i replaced by objective(L_i) before anything is differentiated: J, the heads' gradients and `losses` are
    those of the objectives (DB-MTL's log(L_i + eps), scaled by autograd at the loss node). An aggregator that reads
    each task's gradient once, task by task, may also implement `forward_rows`: the engine then hands it each task's
    gradient as that task's backward returns it, without forming J, where nothing else needs J whole.

    State lives in buffers (and a generator in a `SeededGenerator`); a new value goes back in `Solution.state`. A new
    value of T values per parameter is best built in `self.staging_buffer(name, like)`: the buffer and that spare
    trade places at the commit (no copy, no fresh T×P tensor per step).
    """

    weighs_heads: bool = False
    reads_representation: bool = False
    reads_step: bool = False
    measures_gradients: bool = False

    def objective(self, loss: Tensor) -> Tensor:
        """What is differentiated for a task's loss (a 0-d tensor on the graph); the loss itself unless overridden."""
        return loss

    def forward(self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor) -> Aggregation:
        raise NotImplementedError

    def forward_rows(self, rows: Iterator[list[Tensor]], scale: Optional[Tensor], losses: Tensor) -> Aggregation:
        """`forward` given J row by row: task i's gradient as one tensor per shared parameter (in its dtype; zeros
        where the task does not reach one), yielded as its backward returns it; every row must be read, in order.
        The engine calls it on one process for a joint step of one micro-batch (elsewhere `forward` gets the
        blocks), so it sees the gradients `forward` would. Optional: an aggregator without it always gets blocks."""
        raise NotImplementedError

    def staging_buffer(self, name: str, like: Tensor) -> Tensor:
        """A tensor laid out like `like`, kept from step to step, to build buffer `name`'s next value in; returned in
        `Solution.state`, it becomes the buffer by trading places with it when the step is kept (CPU)."""
        return staging_buffer(self, name, like)
