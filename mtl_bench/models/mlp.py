"""Fully connected trunk with one affine head per task (GradNorm's toy model: 4 FC ReLU layers of 100 units)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from torch import nn

from mtl_bench.models.base import MultiTaskModel

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


class MLP(MultiTaskModel):
    """Trunk: Flatten, then Linear + activation per width; heads: Linear(widths[-1], out_dim) per task.

    `last_shared_layer` is the trunk's last Linear (the shared representation is its activated output).
    Stages (for architectures): one per width.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        widths: Sequence[int] = (100, 100, 100, 100),
        activation: str = "relu",
        arch: Any = None,
    ) -> None:
        """
        input_shape: one sample's shape (given by the engine from the task set).
        heads: each task's output width (given by the engine from the task set).
        widths: the trunk's layer widths, at least one, each > 0.
        activation: relu, tanh or gelu.
        arch: the architecture around the trunk (`model/arch=<name>`; null or hps: hard sharing). Stages: one per
            width (Linear + activation; the first also flattens).
        """
        trunk, last = _trunk(input_shape, widths, activation)
        size = int(widths[-1])
        super().__init__(
            trunk,
            {name: nn.Linear(size, out_dim) for name, out_dim in heads.items()},
            last,
            stages=[1 + 2 * (k + 1) for k in range(len(widths))],
            make_trunk=lambda: _trunk(input_shape, widths, activation)[0],
            input_shape=input_shape,
            arch=arch,
        )


def _trunk(input_shape: Sequence[int], widths: Sequence[int], activation: str) -> tuple[nn.Sequential, nn.Linear]:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    if len(widths) == 0 or not all(int(w) > 0 for w in widths):
        raise ValueError(f"widths: need at least one layer width, each > 0, got {list(widths)}")
    layers: list[nn.Module] = [nn.Flatten()]
    size = math.prod(input_shape)
    linear: nn.Linear | None = None
    for width in widths:
        linear = nn.Linear(size, int(width))
        layers += [linear, ACTIVATIONS[activation]()]
        size = int(width)
    assert linear is not None
    return nn.Sequential(*layers), linear
