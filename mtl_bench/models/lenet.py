"""LeNet-style CNN trunk (after LeCun et al. 1998), small enough for 8x12 digit pairs; one linear head per task."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from torch import nn

from mtl_bench.models.base import MultiTaskModel


class LeNet(MultiTaskModel):
    """Per entry of `channels`: conv 3x3 (padding 1) + ReLU + 2x2 max-pool; then Flatten, Linear(hidden) + ReLU.

    `last_shared_layer` is the Linear(..., hidden); one linear head per task.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        channels: Sequence[int] = (10, 20),
        hidden: int = 50,
        arch: Any = None,
    ) -> None:
        """
        input_shape: one sample's (channels, height, width) (given by the engine from the task set).
        heads: each task's output width (given by the engine from the task set).
        channels: output channels of each conv stage, at least one.
        hidden: width of the shared hidden layer (> 0).
        arch: the architecture around the trunk (`model/arch=<name>`; null or hps: hard sharing). Stages: one per
            conv stage, then the hidden layer.
        """
        if not hidden > 0:
            raise ValueError(f"hidden: must be > 0, got {hidden}")
        trunk, last = _trunk(input_shape, channels, hidden)
        super().__init__(
            trunk,
            {name: nn.Linear(hidden, out_dim) for name, out_dim in heads.items()},
            last,
            stages=[3 * (k + 1) for k in range(len(channels))] + [len(trunk)],
            make_trunk=lambda: _trunk(input_shape, channels, hidden)[0],
            input_shape=input_shape,
            arch=arch,
        )


def _trunk(input_shape: Sequence[int], channels: Sequence[int], hidden: int) -> tuple[nn.Sequential, nn.Linear]:
    if len(input_shape) != 3:
        raise ValueError(f"input_shape: LeNet needs (channels, height, width), got {tuple(input_shape)!r}")
    if len(channels) == 0 or not all(int(c) > 0 for c in channels):
        raise ValueError(f"channels: need at least one conv stage, each > 0, got {list(channels)}")
    in_channels, height, width = input_shape
    layers: list[nn.Module] = []
    for out_channels in channels:
        layers += [nn.Conv2d(in_channels, int(out_channels), 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        in_channels = int(out_channels)
        # Padding 1 keeps the conv's size; the pool floors it by half.
        height, width = height // 2, width // 2
        if height == 0 or width == 0:
            raise ValueError(
                f"channels: input_shape {tuple(input_shape)!r} is too small for {len(channels)} 2x2 pooling stages"
            )
    last = nn.Linear(in_channels * height * width, hidden)
    return nn.Sequential(*layers, nn.Flatten(), last, nn.ReLU()), last
