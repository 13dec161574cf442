"""Multi-task attention network around a backbone's stages (Liu et al., CVPR 2019; LibMTL 1.1.5
architecture/MTAN.py, its ResNet form)."""

from __future__ import annotations

import typing
from typing import Iterator, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.archs.base import Architecture, Backbone


def _blocks(stage: nn.Sequential) -> nn.Sequential:
    """A stage's blocks: the stage itself, or its one child when that is a Sequential (ResNets: `layer<i>`)."""
    children = list(stage.children())
    if len(children) == 1 and isinstance(children[0], nn.Sequential):
        return children[0]
    return stage


def _attention(in_channels: int, mid: int, out_channels: int) -> nn.Sequential:
    """LibMTL's `_att_layer`: conv 1x1, BN, ReLU, conv 1x1, BN, sigmoid."""
    return nn.Sequential(
        nn.Conv2d(in_channels, mid, kernel_size=1, padding=0),
        nn.BatchNorm2d(mid),
        nn.ReLU(inplace=True),
        nn.Conv2d(mid, out_channels, kernel_size=1, padding=0),
        nn.BatchNorm2d(out_channels),
        nn.Sigmoid(),
    )


class MTAN(Architecture):
    """The backbone is shared; each task has an attention module per stage that masks the output of the stage's
    last block with a sigmoid map computed from the output of the blocks before it (and, after the first stage,
    from the task's attended features of the stage before, carried over by a block of the backbone's own kind and
    max-pooled to the size when it differs).

    As LibMTL's ResNet form (the only one it has): attention modules conv 1x1 -> C/e -> C (e: the block's
    `expansion`, 4 for ResNet-50's bottlenecks); the carrying blocks are the backbone's last block class built as
    `cls(C_i, C_{i+1} / e, downsample=conv 1x1 + BN)` (torchvision's BasicBlock and Bottleneck signature). Stages
    must end in feature maps (N, C, H, W) and hold two blocks or more: dilated ResNet-50 and ResNets cut at layer1..4
    (`model=resnet18` ends in its pooled hidden layer: refused).

    Shared parameters: the backbone's and the carrying blocks' (every task's features go through them; LibMTL's
    `get_share_params` leaves the carrying blocks out). Attention modules are task parameters. The shared
    representation is the tasks' attended features stacked (T, N, C, H, W), each read by its own task only, so
    methods at `shared_rep` are refused.
    """

    shared_rep_is_per_task = True

    def __init__(self, backbone: Backbone) -> None:
        """
        backbone: the backbone's trunk and stages (given by the model); stages of two blocks or more ending in
            feature maps.
        """
        super().__init__()
        self.tasks = list(backbone.tasks)
        trunk = backbone.trunk
        levels = backbone.levels(trunk)
        self.shared_conv = levels[0] if backbone.stem else nn.Sequential()
        stages = [_blocks(s) for s in (levels[1:] if backbone.stem else levels)]
        if any(len(s) < 2 for s in stages):
            raise ValueError("backbone: mtan needs every stage to hold two blocks or more (it attends to the last)")
        self.shared_layer = nn.ModuleDict(
            {str(i): nn.ModuleList([s[:-1], s[-1]]) for i, s in enumerate(stages)}  # LibMTL's names
        )
        before, after = self._probe(backbone)
        expansion = int(getattr(type(stages[-1][-1]), "expansion", 1))
        self.encoder_att = nn.ModuleDict()
        self.encoder_block_att = nn.ModuleList()
        for i in range(len(stages)):
            ins = before[i] if i == 0 else 2 * before[i]
            self.encoder_att[str(i)] = nn.ModuleList(
                _attention(ins, after[i] // expansion, after[i]) for _ in self.tasks
            )
            if i < len(stages) - 1:
                block = type(stages[i][-1])
                down = nn.Sequential(nn.Conv2d(after[i], after[i + 1], 1, bias=False), nn.BatchNorm2d(after[i + 1]))
                self.encoder_block_att.append(block(after[i], after[i + 1] // expansion, downsample=down))
        self.down_sampling = nn.MaxPool2d(kernel_size=2, stride=2)
        self._set_last_layers([backbone.last_layer(trunk)])

    def _probe(self, backbone: Backbone) -> tuple[list[int], list[int]]:
        """Channels before and after each stage's last block, from an evaluation-mode forward of zeros."""
        was_training = self.training
        self.eval()
        before, after = [], []
        with torch.no_grad():
            h = self.shared_conv(torch.zeros(1, *backbone.input_shape))
            for i in range(len(self.shared_layer)):
                first, last = typing.cast(nn.ModuleList, self.shared_layer[str(i)])
                h0 = first(h)
                h = last(h0)
                if h0.dim() != 4 or h.dim() != 4:
                    raise ValueError(f"backbone: mtan needs stages ending in feature maps, stage {i} gives {h.dim()}-d")
                before.append(int(h0.shape[1]))
                after.append(int(h.shape[1]))
        self.train(was_training)
        return before, after

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        yield from self.shared_conv.parameters()
        yield from self.shared_layer.parameters()
        yield from self.encoder_block_att.parameters()

    def forward(self, x: Tensor, tasks: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
        h = self.shared_conv(x)
        index = [self.tasks.index(t) for t in tasks]
        att: list[Tensor] = []
        for i in range(len(self.shared_layer)):
            first, last = typing.cast(nn.ModuleList, self.shared_layer[str(i)])
            h0 = first(h)
            h = last(h0)
            modules = typing.cast(nn.ModuleList, self.encoder_att[str(i)])
            for k, t in enumerate(index):
                if i == 0:
                    mask = modules[t](h0)
                else:
                    carried = att[k]
                    if carried.shape[-2:] != h0.shape[-2:]:
                        carried = self.down_sampling(carried)
                    mask = modules[t](torch.cat([h0, carried], dim=1))
                rep = mask * h
                if i < len(self.encoder_block_att):
                    rep = self.encoder_block_att[i](rep)
                if k < len(att):
                    att[k] = rep
                else:
                    att.append(rep)
        stacked = torch.stack(att)  # the heads read its slices: it is on every loss's path
        return stacked, {t: stacked[k] for k, t in enumerate(tasks)}
