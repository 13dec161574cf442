"""The contract of a loss-level method: a loss weighting, the tasks' weights from their losses (and its own state).

The engine (`gradient_engine.loss_weighting_balancer.LossWeightingBalancer`) averages the losses over the DDP ranks,
asks the weighting for w and runs one backward of Σ_i w_i L_i through the loss scale; a weighting only turns L into
w. A complete one:

    class GeometricMeanWeighting(LossWeighting):
        def forward(self, losses):
            return objective_weights(lambda l: l.log().mean().exp(), losses)   # w = ∂f/∂L of f = (Π L_i)^(1/T)
"""

from __future__ import annotations

from typing import Union

from torch import Tensor, nn

from mtl_bench.balancers.weighting import Solution


class LossWeighting(nn.Module):
    """A loss-level method: `forward(losses)` returns the weights w of the tasks' losses (a (T,) tensor or a
    `Solution` with measurements and new buffer values, committed at the balancer's `step()` unless it is skipped).

    `losses`: (T,) float32, detached, the step's losses averaged over the DDP ranks; rows follow `task_names` sorted.
    `per_task`: w_i depends on L_i alone, so the method also runs per-task steps (each task on its own batch): then
    `forward` gets the task's loss in every row and its row is read.
    """

    per_task: bool = False

    def forward(self, losses: Tensor) -> Union[Tensor, Solution]:
        raise NotImplementedError
