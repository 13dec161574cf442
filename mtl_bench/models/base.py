"""Hard parameter sharing: one shared trunk, one head per task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

from torch import Tensor, nn

from mtl_bench.models.archs.base import Architecture, Backbone


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
    (gradient_engine/gradient_balancer.py); only methods defined at `shared` itself (grad_source=shared_rep, GradDrop)
    refuse.

    Backbones that declare `stages` (the end index of each stage in their trunk, an nn.Sequential; `stem`: where a
    stem ends inside the first) and `make_trunk` (a fresh trunk, built as the first) can be wrapped by an
    architecture (`arch`, mtl_bench.models.archs: mixtures of experts, cross-stitch, ...); it then takes the trunk's
    place as `self.trunk` and names the shared parameters, the shared representation and the last shared layer.
    `arch` None or `hps` keeps the trunk.
    """

    def __init__(
        self,
        trunk: nn.Module,
        heads: dict[str, nn.Module],
        last_shared_layer: nn.Module,
        stages: Sequence[int] = (),
        stem: int = 0,
        make_trunk: Optional[Callable[[], nn.Sequential]] = None,
        input_shape: Sequence[int] = (),
        arch: Optional[Callable[..., Any]] = None,
    ) -> None:
        super().__init__()
        if arch is not None:
            if make_trunk is None or not isinstance(trunk, nn.Sequential):
                raise ValueError(f"arch: {type(self).__name__} declares no stages, so only hps wraps it")
            names = {id(m): n for n, m in trunk.named_modules()}
            backbone = Backbone(
                trunk, make_trunk, tuple(stages), names[id(last_shared_layer)], tuple(heads), tuple(input_shape), stem
            )
            try:
                body = arch(backbone=backbone)
            except ValueError as err:  # "num_experts: ..." -> "arch.num_experts: ...", shown as model.arch.num_experts
                raise ValueError(f"arch.{err}") from None
            if body is not trunk:
                trunk, last_shared_layer = body, body.last_shared_layer
        self.trunk = trunk
        self.heads = nn.ModuleDict(heads)
        # Stored outside the module registry: it is already a submodule of the trunk.
        self.__dict__["_last_shared_layer"] = last_shared_layer

    @property
    def last_shared_layer(self) -> nn.Module:
        return self.__dict__["_last_shared_layer"]

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        if isinstance(self.trunk, Architecture):
            return self.trunk.shared_parameters()
        return self.trunk.parameters()

    def shared_rep_problem(self) -> Optional[str]:
        """Why the shared representation cannot carry per-task gradients (None: it can)."""
        if isinstance(self.trunk, Architecture) and self.trunk.shared_rep_is_per_task:
            return (
                f"{type(self.trunk).__name__} has no representation shared by all tasks (each task reads its own "
                "column or features), so per-task gradients there do not overlap; use grad_source=shared_params"
            )
        return None

    def set_progress(self, epoch: int, epochs: int) -> None:
        """The epoch about to be trained (from 0) and the number of epochs, for architectures that schedule by
        them (LTB); the engine calls it before each epoch and after a resume."""
        if isinstance(self.trunk, Architecture):
            self.trunk.set_progress(epoch, epochs)

    def measurements(self) -> dict[str, Tensor]:
        """What the architecture learned, as device tensors of the last training forward (gates' mean mixture
        weights, cross-stitch coefficients), keyed by TensorBoard tag; empty for hard sharing."""
        return self.trunk.measurements() if isinstance(self.trunk, Architecture) else {}

    def task_parameters(self, task: str) -> Iterator[nn.Parameter]:
        return self.heads[task].parameters()

    def forward(self, x: Tensor, tasks: Optional[Sequence[str]] = None) -> ModelOutput:
        """Predictions of every head, or only of `tasks` (per-task steps: the other heads would not reach
        the loss, which DDP must not wait for)."""
        names = list(self.heads.keys() if tasks is None else tasks)
        if isinstance(self.trunk, Architecture):
            shared, reps = self.trunk(x, names)
            return ModelOutput(shared=shared, preds={name: self.heads[name](reps[name]) for name in names})
        shared = self.trunk(x)
        return ModelOutput(shared=shared, preds={name: self.heads[name](shared) for name in names})
