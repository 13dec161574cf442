"""The contract of a gradient method that needs the gradients themselves (per coordinate, not only their Gramian):
an aggregator, the shared direction from the tasks' gradient blocks (and losses, and its own state).

The engine (`gradient_engine.aggregator_balancer.AggregatorBalancer`) gathers the per-task gradients at the shared
parameters and writes the direction into `.grad`; an aggregator only turns J into the direction. A complete one:

    class Mean(Aggregator):
        def forward(self, blocks, scale, losses):
            t = blocks[0].shape[0]
            return Aggregation([block.mean(0) for block in blocks], Solution(torch.full((t,), 1 / t)))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import Tensor, nn

from mtl_bench.balancers.weighting import Solution


@dataclass
class Aggregation:
    """What an aggregator returns: the direction, one tensor per block shaped like its parameter (`block.shape[1:]`)
    and scaled as the blocks are, and a `Solution` whose (T,) weights are logged as `weight/<task>` (each task's share
    of the direction), with its measurements and the new values of its buffers (committed at the balancer's `step()`
    unless it is skipped)."""

    direction: list[Tensor]
    solution: Solution


class Aggregator(nn.Module):
    """A gradient method: `forward(blocks, scale, losses)` returns an `Aggregation`.

    `blocks`: J as one (T, *p.shape) block per shared parameter (`gradient_engine.blocks.flat_rows` views one as
    (T, P) without a copy), the gradients of the scaled losses (`scale`: the loss scale, None without one: divide
    by it where the method is not homogeneous), summed over the step's micro-batches. `losses`: (T,) the step's mean
    losses. Rows follow `task_names` sorted. The heads get their own gradients (weight 1).
    """

    def forward(self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor) -> Aggregation:
        raise NotImplementedError
