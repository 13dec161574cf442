"""The CelebA CNN of FAMO (Liu et al. NeurIPS 2023; github.com/Cranial-XIX/FAMO at 0a6ad06, experiments/celeba/models.py
`Network`): nine layers (seven bias-free 3x3 convs, two bias-free linears, each with batch norm and ReLU) shared,
one linear head per attribute. Nash-MTL (AvivNavon/nash-mtl) has no CelebA model."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from torch import nn

from mtl_bench.models.base import MultiTaskModel


def _conv(in_channels: int, out_channels: int) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, 3, stride=1, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    ]


def _linear(in_features: int, out_features: int) -> list[nn.Module]:
    return [nn.Linear(in_features, out_features, bias=False), nn.BatchNorm1d(out_features), nn.ReLU(inplace=True)]


class CelebACNN(MultiTaskModel):
    """FAMO's `Network.shared_base` as the trunk, in its module order:
    conv(c0) pool | conv(c1) conv(c1) pool | conv(c2) conv(c2) pool | conv(c3) conv(c3) | global average pool,
    flatten | linear(hidden) | linear(hidden), where conv = Conv2d 3x3 (padding 1, no bias) + BatchNorm2d + ReLU,
    pool = 2x2 max-pool, linear = Linear (no bias) + BatchNorm1d + ReLU; `shared` is the (N, hidden) output.
    Heads: Linear(hidden, out_dim) with bias per task. FAMO's heads end in a sigmoid; here they return the logit
    and the task's loss applies it (`mtl_bench.tasks.celeba`). With the defaults the trunk has 5,176,640
    parameters and each one-logit head 513, as FAMO's.

    `last_shared_layer` is the trunk's last Linear (the last layer of weights; FAMO's `last_shared_parameters`
    names none).
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        channels: Sequence[int] = (64, 128, 256, 512),
        hidden: int = 512,
        arch: Any = None,
    ) -> None:
        """
        input_shape: one sample's (channels, height, width) (given by the engine from the task set); height and
            width at least 8 (three 2x2 pools).
        heads: each task's output width (given by the engine from the task set).
        channels: the four conv stages' widths (FAMO: 64, 128, 256, 512).
        hidden: width of the two shared linear layers and of `shared` (FAMO: 512).
        arch: the architecture around the trunk (`model/arch=<name>`; null or hps: hard sharing). Stages: the four
            conv stages (each ending at its pooling), then the two linears.
        """
        if len(input_shape) != 3 or not all(int(s) > 0 for s in input_shape):
            raise ValueError(f"input_shape: CelebACNN needs (channels, height, width), got {tuple(input_shape)!r}")
        if min(int(input_shape[1]), int(input_shape[2])) < 8:
            raise ValueError(
                f"input_shape: height and width must be >= 8 (three 2x2 max-pools), got {tuple(input_shape)!r}"
            )
        if (
            isinstance(channels, (str, bytes))
            or len(channels) != 4
            or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in channels)
        ):
            raise ValueError(f"channels: must be four integers > 0 (the conv stages' widths), got {channels!r}")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0:
            raise ValueError(f"hidden: must be an integer > 0, got {hidden!r}")
        trunk, stages = _trunk(int(input_shape[0]), channels, hidden)
        last = [m for m in trunk if isinstance(m, nn.Linear)][-1]
        super().__init__(
            trunk,
            {name: nn.Linear(hidden, int(out)) for name, out in heads.items()},
            last,
            stages=stages,
            make_trunk=lambda: _trunk(int(input_shape[0]), channels, hidden)[0],
            input_shape=input_shape,
            arch=arch,
        )


def _trunk(in_channels: int, channels: Sequence[int], hidden: int) -> tuple[nn.Sequential, list[int]]:
    """The trunk and the end of each stage (4 conv stages, the linears)."""
    c0, c1, c2, c3 = (int(c) for c in channels)
    layers: list[nn.Module] = [*_conv(in_channels, c0), nn.MaxPool2d(2, stride=2, padding=0)]
    stages = [len(layers)]
    layers += [*_conv(c0, c1), *_conv(c1, c1), nn.MaxPool2d(2, stride=2, padding=0)]
    stages.append(len(layers))
    layers += [*_conv(c1, c2), *_conv(c2, c2), nn.MaxPool2d(2, stride=2, padding=0)]
    stages.append(len(layers))
    layers += [*_conv(c2, c3), *_conv(c3, c3), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    stages.append(len(layers))
    layers += [*_linear(c3, hidden), *_linear(hidden, hidden)]
    stages.append(len(layers))
    return nn.Sequential(*layers), stages
