"""LeNet-style CNN trunk (after LeCun et al. 1998), small enough for 8x12 digit pairs; one linear head per task."""

from __future__ import annotations

from typing import Sequence

from torch import nn

from mtl_bench.models.base import MultiTaskModel


def build_lenet(input_shape: tuple[int, ...], heads: dict[str, int], channels: Sequence[int] = (10, 20),
                hidden: int = 50) -> MultiTaskModel:
    """Per entry of `channels`: conv 3x3 (padding 1) + ReLU + 2x2 max-pool; then Flatten, Linear(hidden) + ReLU.

    `input_shape` is (C, H, W); `last_shared_layer` is the Linear(..., hidden).
    """
    if len(input_shape) != 3:
        raise ValueError(f"input_shape={tuple(input_shape)!r} is not allowed: LeNet needs (channels, height, width)")
    if len(channels) == 0:
        raise ValueError("channels=[] is not allowed: LeNet needs at least one conv stage")
    in_channels, height, width = input_shape
    layers: list[nn.Module] = []
    for out_channels in channels:
        layers += [nn.Conv2d(in_channels, int(out_channels), 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        in_channels = int(out_channels)
        # Padding 1 keeps the conv's size; the pool floors it by half.
        height, width = height // 2, width // 2
        if height == 0 or width == 0:
            raise ValueError(f"input_shape={tuple(input_shape)!r} is too small for {len(channels)} 2x2 pooling stages")
    last = nn.Linear(in_channels * height * width, hidden)
    trunk = nn.Sequential(*layers, nn.Flatten(), last, nn.ReLU())
    heads_ = {name: nn.Linear(hidden, out_dim) for name, out_dim in heads.items()}
    return MultiTaskModel(trunk, heads_, last_shared_layer=last)
