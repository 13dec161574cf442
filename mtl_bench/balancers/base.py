"""The balancer interface: turn per-task losses into gradients and report what it did."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn


class GradScalerLike(Protocol):
    def scale(self, outputs: Tensor) -> Tensor: ...


class Balancer(nn.Module):
    """Runs the backward of a multi-task step.

    `backward(losses, shared)` decides the per-task weights (possibly from gradient norms measured
    at `shared`, the shared representation), runs the backward pass (through `scaler` when given,
    for fp16), updates the balancer's own state, and returns its measurements as 0-d tensors keyed by
    TensorBoard tag (`weight/<task>`, `ratio/<task>`, `grad_norm/<task>`, ...). It never calls `.item()`:
    the trainer reads the values only every `log_every` steps.

    Being an `nn.Module`, any learnable state (GradNorm's weights) or running statistics (EMA buffers)
    is part of `state_dict()`, so checkpoints restore it.

    The step protocol (what a training loop calls; `FixedWeights` has no state, so `step` is a no-op):

    joint mode (one batch carries every task)::

        metrics = balancer.backward(losses, out.shared, scaler)  # all tasks at once
        scaler.step(optimizer); scaler.update()                  # or optimizer.step()
        metrics |= balancer.step()                               # commit the state update

    per-task mode (one batch per task, gradients accumulate, one optimizer step)::

        for task, batch in batches:
            out = model(batch.inputs)
            metrics |= balancer.backward_task(task, loss_of(task, out), out.shared, scaler)
        scaler.step(optimizer); scaler.update()
        metrics |= balancer.step()                               # update the weights once, from all tasks

    Each `backward_task` uses the weights/scales the balancer holds at the start of the step and records
    that task's statistics; `step()` computes the state update from all of them (every task must have had
    its `backward_task`) and returns the metrics that need all tasks (ratios, GradNorm targets). Under
    DDP every rank must run the tasks in the same order (statistics may be reduced task by task).

    State updates (EMA of norms, GradNorm's weights, L_i(0), optimizer moments) are staged during the
    backward and committed by `step()`, so a step that is not taken leaves the state unchanged:
    - with a grad scaler, `step()` called after `scaler.update()` sees a skipped step by itself (the scale
      went down: GradScaler lowers it, by backoff_factor < 1, exactly when it skipped), on the device,
      without a host sync; gradient norms are always measured on unscaled gradients;
    - `step(skipped=True)` (or a 0-d bool tensor) when the loop skips the step for its own reasons;
    - statistics that are not finite (NaN/inf norms or losses) never enter the state.
    When to call `step()`: always in per-task mode; in joint mode whenever a scaler was passed or
    `defer_updates = True` (set it when the loop may skip steps). In joint mode without a scaler and with
    `defer_updates = False` (the default) `backward` commits at once, so a library user may call `backward`
    alone; `step()` is then a no-op. A joint `backward` while an update is still pending raises (the loop
    forgot `step()`).

    Gradient accumulation: set `accumulates = True` and call `backward` (or every task's `backward_task`)
    once per micro-batch, with a scaler-like object that also multiplies by 1/k if the gradient should be
    the mean. Each micro-batch's statistics enter the step's running mean; the staged update is rebuilt
    from the committed state and that mean, so `step()` commits one update from the mean of all
    micro-batches (GradNorm's weights stay those of the step's start until then).
    """

    defer_updates: bool = False
    accumulates: bool = False

    task_names: list[str]

    def __init__(self, task_names: list[str]) -> None:
        super().__init__()
        if not task_names:
            raise ValueError("a balancer needs at least one task")
        self.task_names = list(task_names)

    def check_losses(self, losses: dict[str, Tensor]) -> None:
        """Losses must name exactly the balancer's tasks."""
        if set(losses) != set(self.task_names):
            raise KeyError(
                f"losses for tasks {sorted(losses)} do not match the balancer's tasks {sorted(self.task_names)}"
            )

    def backward(
        self,
        losses: dict[str, Tensor],
        shared: Tensor,
        scaler: GradScalerLike | None = None,
    ) -> dict[str, Tensor]:
        raise NotImplementedError

    def backward_task(
        self,
        task: str,
        loss: Tensor,
        shared: Tensor,
        scaler: GradScalerLike | None = None,
    ) -> dict[str, Tensor]:
        """Per-task mode: the backward of one task's loss on its own batch (see the class docstring)."""
        raise NotImplementedError(f"{type(self).__name__} has no per-task mode")

    def step(self, skipped: bool | Tensor | None = None) -> dict[str, Tensor]:
        """Commit the state update of this step unless the step was skipped; stateless balancers: no-op."""
        return {}

    @staticmethod
    def run_backward(total: Tensor, scaler: GradScalerLike | None) -> None:
        (scaler.scale(total) if scaler is not None else total).backward()

    def extra_repr(self) -> str:
        return f"tasks={self.task_names}"


def stack_weights(weights: dict[str, float], task_names: list[str]) -> torch.Tensor:
    return torch.tensor([float(weights[name]) for name in task_names], dtype=torch.float32)
