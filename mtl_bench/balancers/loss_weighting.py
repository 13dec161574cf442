"""The contract of a loss-level method: a loss weighting, the tasks' weights from their losses (and its own state).

The engine (`gradient_engine.loss_weighting_balancer.LossWeightingBalancer`) averages the losses over the DDP ranks,
asks the weighting for w, runs one backward of Σ_i w_i L_i through the loss scale, and once per optimizer step asks it
for its state's next values; a weighting only turns L into w (and into its next state). A complete one:

    class GeometricMeanWeighting(LossWeighting):
        def forward(self, losses):
            return objective_weights(lambda l: l.log().mean().exp(), losses)   # w = ∂f/∂L of f = (Π L_i)^(1/T)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from torch import Tensor, nn

from mtl_bench.balancers.weighting import Solution


class LossWeighting(nn.Module):
    """A loss-level method: `forward(losses)` returns the weights w of the tasks' losses for this backward (a (T,)
    tensor, or a `Solution` with measurements); `update(losses, items)` returns the next values of its buffers.

    `losses`: (T,) float32, detached, averaged over the DDP ranks; rows follow `task_names` sorted. A weighting with an
    `update` gets, under gradient accumulation, the mean of the step's micro-batches so far (the last micro-batch's is
    the whole step's); one without gets each micro-batch's own losses, and so does one with `step_mean = False` (its
    state is no statistic of the losses: a preference drawn once per step).

    `update(losses, items)`: called once per optimizer step, after the step's last backward (in per-task mode at the
    balancer's `step()`), with the whole step's losses (weighted by `items`, (T,) the examples each loss averaged over:
    the batch size, averaged over micro-batches and ranks). What it returns (buffer name -> new value) is committed at
    the balancer's `step()` unless the step is skipped or a loss is not finite. The default: no state.

    `per_task`: w_i depends on L_i alone, so the method also runs per-task steps (each task on its own batch): then
    `forward` gets the task's loss in every row and its row (and its measurements ending in `/<task>`) is read.
    `reads_losses = False`: neither `forward` nor `update` reads the losses (the weights come from the state alone),
    so the engine gives each rank's own and spends no collective on them.

    `stateful`: whether it has an update, by default whether its class defines one; a weighting whose options leave it
    no state (a fixed preference of a method that can draw one) says False and runs as a weighting without.

    `on_graph = True`: the weighting differentiates the step's losses with respect to the model (a bilevel method's
    look-ahead). Its `forward(losses, scale, epoch)` gets this rank's losses of this micro-batch WITH their autograd
    graph, one by one (a tuple of T 0-d tensors, float32 or float64, in task order: a task's own gradient then walks
    its own branch only; `torch.stack` them for a sum), `scale` the grad scaler's loss scale at the step's start (a 0-d
    tensor; None without a scaler: take gradients of `scale * loss`, then divide, as `staged.scaled_grad`) and `epoch`
    the step's epoch index (`BackwardContext.epoch`, from 0; 0 without a context), for a schedule that follows epochs.
    The engine keeps the graph for its own backward: take gradients with `retain_graph=True`. Its state is the
    `state` of the `Solution` it returns (buffer name -> new value; it has no `update`), committed at the balancer's
    `step()` unless the step is skipped or one of the new values is not finite. The engine then backpropagates
    Σ_i w_i L_i, or the `objective` of a `GraphSolution` in its place. It runs joint steps (`per_task` is not read);
    under accumulation each micro-batch's forward sees the state committed at the last step, and the last one's new
    state is committed. `HOST_SOLVE`: what `forward` solves on the host, if anything (`Balancer.HOST_SOLVE`).
    """

    per_task: bool = False
    reads_losses: bool = True
    step_mean: bool = True
    on_graph: bool = False
    HOST_SOLVE: str = ""

    @property
    def stateful(self) -> bool:
        return type(self).update is not LossWeighting.update

    def forward(self, losses: Tensor) -> Union[Tensor, Solution]:
        raise NotImplementedError

    def update(self, losses: Tensor, items: Tensor) -> dict[str, Tensor]:
        return {}


@dataclass
class GraphSolution:
    """What an `on_graph` weighting may return in place of a `Solution`: the solution (its weights only reported as
    `weight/<task>`, its metrics and state as usual) and `objective`, a 0-d tensor on the model's graph that the step
    backpropagates in place of Σ_i w_i L_i (e.g. Σ_p ⟨d_p, p⟩ for a direction d the weighting computed)."""

    solution: Solution
    objective: Tensor
