"""What an architecture gets from a backbone (`Backbone`) and what it gives the model (`Architecture`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Backbone:
    """A backbone's trunk and how to cut it, as its model class declares them (the architecture never asks which
    backbone it is).

    trunk: the trunk the model built (an architecture may use it as its first column or expert).
    make_trunk: builds a fresh trunk of the same shape (own initialisation; pretrained weights if configured).
    stages: end index in the trunk (nn.Sequential) of each stage, ascending; the last is len(trunk).
    stem: end index of the stem inside the first stage (ResNets: conv1, bn1, relu, maxpool), 0 if none: PLE makes it
        a level of its own, cross-stitch does not stitch after it (LibMTL's cuts).
    last_shared: qualified name of the trunk's last shared layer (`trunk.get_submodule(last_shared)`).
    tasks: the task names, in the task set's order.
    input_shape: one sample's shape.
    """

    trunk: nn.Sequential
    make_trunk: Callable[[], nn.Sequential]
    stages: tuple[int, ...]
    last_shared: str
    tasks: tuple[str, ...]
    input_shape: tuple[int, ...]
    stem: int = 0

    @property
    def input_size(self) -> int:
        """Features of one flattened input (the gates' input width)."""
        return math.prod(int(s) for s in self.input_shape)

    def fresh(self, count: int, reuse: bool = True) -> list[nn.Sequential]:
        """`count` trunks: the built one first (`reuse`), then fresh ones."""
        first = [self.trunk] if reuse and count > 0 else []
        return first + [self.make_trunk() for _ in range(count - len(first))]

    def cut(self, trunk: nn.Sequential) -> list[nn.Sequential]:
        """The trunk's stages, each an nn.Sequential sharing the trunk's modules."""
        if not self.stages or self.stages[-1] != len(trunk):
            raise ValueError(f"stages: must end at the trunk's length {len(trunk)}, got {list(self.stages)}")
        starts = (0, *self.stages[:-1])
        return [trunk[a:b] for a, b in zip(starts, self.stages)]

    def levels(self, trunk: nn.Sequential) -> list[nn.Sequential]:
        """The stages with the stem, if any, cut off as a level of its own."""
        stages = self.cut(trunk)
        if not self.stem:
            return stages
        return [trunk[: self.stem], stages[0][self.stem :], *stages[1:]]

    def last_layer(self, trunk: nn.Module) -> nn.Module:
        return trunk.get_submodule(self.last_shared)


class LastLayers(nn.Module):
    """Several trunks' last shared layers seen as one layer (GradNorm measures at all of their parameters)."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class Architecture(nn.Module):
    """Takes the trunk's place in `MultiTaskModel`: `forward(x, tasks) -> (shared, {task: representation})`, the
    representation each task's head reads.

    `shared` is the shared representation handed to the balancer: a tensor every path from the shared parameters to
    the losses goes through (so `grad_source=shared_rep` is exact). `shared_parameters()` follows LibMTL's
    `get_share_params`; `last_shared_layer` holds every shared column's or expert's last layer; `measurements()`
    returns device tensors of the last training forward, keyed by TensorBoard tag.
    """

    # True where `shared` stacks one representation per task, each read by its own task only: gradients at it
    # are zero outside each task's slice, which methods comparing gradients at `shared_rep` cannot use.
    shared_rep_is_per_task = False

    def __init__(self) -> None:
        super().__init__()
        self._measured: dict[str, Tensor] = {}
        self.__dict__["_last_layers"] = None

    @property
    def last_shared_layer(self) -> nn.Module:
        return self.__dict__["_last_layers"]

    def _set_last_layers(self, layers: Sequence[nn.Module]) -> None:
        # Outside the module registry: these layers are already submodules of the columns or experts.
        self.__dict__["_last_layers"] = layers[0] if len(layers) == 1 else LastLayers(layers)

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        raise NotImplementedError

    def measurements(self) -> dict[str, Tensor]:
        return dict(self._measured)

    def set_progress(self, epoch: int, epochs: int) -> None:
        """The training progress, for architectures that schedule by it (LTB's temperature); others ignore it."""

    def _measure_gate(self, task: str, weights: Tensor, names: Sequence[str]) -> None:
        """Mean over the batch of a task's mixture weights (N, E), kept on the device."""
        if self.training and torch.is_grad_enabled():
            mean = weights.detach().float().mean(0)
            for name, value in zip(names, mean.unbind()):
                self._measured[f"arch/gate/{task}/{name}"] = value


def mix(experts: Tensor, weights: Tensor) -> Tensor:
    """Sum over experts (E, N, ...) weighted per sample by (N, E): (N, ...) (LibMTL's einsum 'ij..., ji -> j...')."""
    return torch.einsum("ij..., ji -> j...", experts, weights)


def check_count(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return value
