"""Hard parameter sharing: one shared trunk, one head per task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from torch import Tensor, nn


@dataclass
class ModelOutput:
    """`shared` is the trunk's output (the shared representation); `preds[task]` each head's output."""

    shared: Tensor
    preds: dict[str, Tensor]


class MultiTaskModel(nn.Module):
    """`trunk` maps inputs to the shared representation; `heads[task]` maps it to that task's prediction.

    `last_shared_layer` is the trunk's last module with parameters (GradNorm measures gradient norms
    there); `shared_parameters()` are the trunk's parameters.

    A subclass may override `forward`, `shared_parameters()` and `task_parameters()`, and its predictions may
    read shared features other than `shared` (SegNet-MTAN's attention modules read every stage): the gradient
    balancers find this in the autograd graph and take exact per-task gradients at the shared parameters
    (balancers/jacobian.py); only methods defined at `shared` itself (grad_source=shared_rep, GradDrop) refuse.
    """

    def __init__(self, trunk: nn.Module, heads: dict[str, nn.Module], last_shared_layer: nn.Module) -> None:
        super().__init__()
        self.trunk = trunk
        self.heads = nn.ModuleDict(heads)
        # Stored outside the module registry: it is already a submodule of the trunk.
        self.__dict__["_last_shared_layer"] = last_shared_layer

    @property
    def last_shared_layer(self) -> nn.Module:
        return self.__dict__["_last_shared_layer"]

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        return self.trunk.parameters()

    def task_parameters(self, task: str) -> Iterator[nn.Parameter]:
        return self.heads[task].parameters()

    def forward(self, x: Tensor, tasks: Optional[Sequence[str]] = None) -> ModelOutput:
        """Predictions of every head, or only of `tasks` (per-task steps: the other heads would not reach
        the loss, which DDP must not wait for)."""
        shared = self.trunk(x)
        names = self.heads.keys() if tasks is None else tasks
        return ModelOutput(shared=shared, preds={name: self.heads[name](shared) for name in names})
