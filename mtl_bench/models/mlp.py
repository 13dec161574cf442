"""Fully connected trunk with one affine head per task (GradNorm's toy model: 4 FC ReLU layers of 100 units)."""

from __future__ import annotations

import math
from typing import Sequence

from torch import nn

from mtl_bench.models.base import MultiTaskModel

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


def build_mlp(input_shape: tuple[int, ...], heads: dict[str, int], widths: Sequence[int] = (100, 100, 100, 100),
              activation: str = "relu") -> MultiTaskModel:
    """Trunk: Flatten, then Linear + activation per width; heads: Linear(widths[-1], out_dim) per task.

    `last_shared_layer` is the trunk's last Linear (the shared representation is its activated output).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not allowed: one of {', '.join(ACTIVATIONS)}")
    if len(widths) == 0:
        raise ValueError("widths=[] is not allowed: an MLP trunk needs at least one layer width")
    layers: list[nn.Module] = [nn.Flatten()]
    size = math.prod(input_shape)
    linear = None
    for width in widths:
        linear = nn.Linear(size, int(width))
        layers += [linear, ACTIVATIONS[activation]()]
        size = int(width)
    heads_ = {name: nn.Linear(size, out_dim) for name, out_dim in heads.items()}
    return MultiTaskModel(nn.Sequential(*layers), heads_, last_shared_layer=linear)
