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
    """

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

    @staticmethod
    def run_backward(total: Tensor, scaler: GradScalerLike | None) -> None:
        (scaler.scale(total) if scaler is not None else total).backward()

    def extra_repr(self) -> str:
        return f"tasks={self.task_names}"


def stack_weights(weights: dict[str, float], task_names: list[str]) -> torch.Tensor:
    return torch.tensor([float(weights[name]) for name in task_names], dtype=torch.float32)
