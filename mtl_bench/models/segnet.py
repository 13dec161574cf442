"""SegNet (Badrinarayanan et al. 2017) as the multi-task encoder-decoder of MTAN (Liu et al., CVPR 2019), with
hard parameter sharing: the whole encoder-decoder is shared and each task has a small conv head.

The reference is MTAN's `im2im_pred/model_segnet_split.py` ("standard" type) and its copy `SegNetSplit` in
Nash-MTL's and FAMO's `experiments/nyuv2/models.py` (lorenmt/mtan c36c30b, AvivNavon/nash-mtl cce1840,
Cranial-XIX/FAMO 0a6ad06): the NYUv2/Cityscapes "SegNet" model of those papers' tables. `SegNetTrunk` is also
the shared network of `SegNetMTAN`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from mtl_bench.models.base import MultiTaskModel

FILTERS = (64, 128, 256, 512, 512)  # the reference's `filter` (its "wide" type is [64, 128, 256, 512, 1024])


def conv_layer(in_channels: int, out_channels: int) -> nn.Sequential:
    """The reference's `conv_layer`: conv 3x3 (padding 1) + BatchNorm + ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True)
    )


def prediction_head(channels: int, out_channels: int, normalize: bool) -> nn.Sequential:
    """The reference's task head (`pred_task*`): conv 3x3 (channels -> channels), conv 1x1 (-> out_channels),
    no normalisation or activation between them; `normalize`: the output is L2-normalised over channels."""
    layers: list[nn.Module] = [nn.Conv2d(channels, channels, 3, padding=1), nn.Conv2d(channels, out_channels, 1)]
    if normalize:
        layers.append(ChannelNormalize())
    return nn.Sequential(*layers)


class ChannelNormalize(nn.Module):
    """x / ‖x‖₂ over the channel dimension (MTAN's surface-normal output, `t3_pred / torch.norm(t3_pred, dim=1)`;
    F.normalize's eps=1e-12 floor on the norm only differs where the reference divides by ~0)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, p=2.0, dim=1)


def init_weights(module: nn.Module) -> None:
    """The reference's initialisation: conv weights Xavier-normal, biases 0; BatchNorm weight 1, bias 0."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_normal_(m.weight)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)


def check_filters(filters: Sequence[int]) -> list[int]:
    widths = [int(f) for f in filters]
    if not widths or not all(f > 0 for f in widths) or any(f != g for f, g in zip(widths, filters)):
        raise ValueError(f"filters: need one channel count per encoder stage, each an integer > 0, got {list(filters)}")
    return widths


def check_image_shape(input_shape: Sequence[int], stages: int, model: str) -> int:
    """The input's channels; height and width must survive `stages` 2x2 poolings exactly (the unpooling
    and MTAN's 2x upsampling restore the encoder's sizes only then)."""
    if len(input_shape) != 3:
        raise ValueError(f"input_shape: {model} needs (channels, height, width), got {tuple(input_shape)!r}")
    channels, height, width = (int(n) for n in input_shape)
    factor = 2**stages
    if channels <= 0 or height <= 0 or width <= 0 or height % factor or width % factor:
        raise ValueError(
            f"input_shape: {model} with {stages} pooling stages needs height and width divisible by "
            f"{factor}, got {tuple(input_shape)!r}"
        )
    return channels


def check_normalize(normalize: Sequence[str]) -> set[str]:
    if isinstance(normalize, str) or not all(isinstance(name, str) for name in normalize):
        raise ValueError(f"normalize: need a list of task names, got {normalize!r}")
    return set(normalize)


@dataclass
class SegNetFeatures:
    """What the shared network computes, per stage (MTAN's attention modules read all of it).

    `encoder[j]`: (the output of encoder block j, the output of its conv block) at 1/2^j of the input size;
    `unpooled[j]`: the input of decoder stage j (decoder stage j works at 1/2^(n-1-j) of the input size);
    `decoder[j]`: (the output of decoder block, the output of its conv block) of decoder stage j.
    `decoder[-1][1]` is the shared representation.
    """

    encoder: list[tuple[Tensor, Tensor]]
    unpooled: list[Tensor]
    decoder: list[tuple[Tensor, Tensor]]


class SegNetTrunk(nn.Module):
    """The shared SegNet of MTAN's code: per stage i of `filters`, an encoder block (conv layer to filters[i])
    and a conv block (one conv layer at stages 0 and 1, two after), then 2x2 max-pooling with indices; the
    decoder mirrors it (unpooling with the encoder's indices, a decoder block to filters[i-1], a conv block).
    Parameter names follow the reference's (`encoder_block`, `conv_block_enc`, `decoder_block`, `conv_block_dec`;
    decoder modules are indexed by the stage they mirror, so the decoder runs them from the last index down)."""

    def __init__(self, in_channels: int, filters: Sequence[int]) -> None:
        super().__init__()
        f = list(filters)
        n = len(f)
        self.encoder_block = nn.ModuleList(
            [conv_layer(in_channels, f[0])] + [conv_layer(f[i], f[i + 1]) for i in range(n - 1)]
        )
        self.decoder_block = nn.ModuleList(
            [conv_layer(f[0], f[0])] + [conv_layer(f[i + 1], f[i]) for i in range(n - 1)]
        )
        self.conv_block_enc = nn.ModuleList([_conv_block(f[i], 1 if i < 2 else 2) for i in range(n)])
        self.conv_block_dec = nn.ModuleList([_conv_block(f[max(i - 1, 0)], 1 if i < 2 else 2) for i in range(n)])

    @property
    def last_conv(self) -> nn.Conv2d:
        """The decoder's last conv (the last layer with parameters before the shared representation)."""
        convs = [m for m in self.conv_block_dec[0].modules() if isinstance(m, nn.Conv2d)]
        return convs[-1]

    def features(self, x: Tensor) -> SegNetFeatures:
        encoder, indices, sizes = [], [], []
        for enc, conv in zip(self.encoder_block, self.conv_block_enc):
            first = enc(x)
            second = conv(first)
            encoder.append((first, second))
            sizes.append(second.shape[-2:])
            x, idx = F.max_pool2d(second, kernel_size=2, stride=2, return_indices=True)
            indices.append(idx)
        unpooled, decoder = [], []
        for i in reversed(range(len(self.encoder_block))):
            up = F.max_unpool2d(x, indices[i], kernel_size=(2, 2), stride=(2, 2), output_size=sizes[i])
            first = self.decoder_block[i](up)
            x = self.conv_block_dec[i](first)
            unpooled.append(up)
            decoder.append((first, x))
        return SegNetFeatures(encoder, unpooled, decoder)

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x).decoder[-1][1]


def _conv_block(channels: int, layers: int) -> nn.Sequential:
    if layers == 1:
        return conv_layer(channels, channels)
    return nn.Sequential(*(conv_layer(channels, channels) for _ in range(layers)))


class SegNet(MultiTaskModel):
    """SegNet with hard parameter sharing (MTAN's `model_segnet_split.py`, Nash-MTL's and FAMO's `SegNet`).

    The encoder-decoder (`SegNetTrunk`) is shared; `shared` is its last feature map (filters[0] channels at the
    input resolution) and `last_shared_layer` the decoder's last conv. Each task's head is conv 3x3 + conv 1x1
    to its output channels. Predictions are (N, C_task, H, W) at the input resolution:

    - segmentation: logits. The reference returns log_softmax and trains with NLL; the task set's
      cross-entropy on logits (ignoring -1) is the same loss, and argmax (mIoU, pixel accuracy) is the same.
    - depth: raw, as the reference.
    - tasks in `normalize` (default: normal): L2-normalised over channels, as the reference's normal output.

    At the default widths the model has the reference's parameters (a test checks the count).
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        filters: Sequence[int] = FILTERS,
        normalize: Sequence[str] = ("normal",),
    ) -> None:
        """
        input_shape: one sample's (channels, height, width) (given by the engine from the task set); height
            and width must be divisible by 2^len(filters) (32 with the default five stages).
        heads: each task's output channels (given by the engine from the task set).
        filters: channels of each encoder stage, one entry per stage (the reference's [64, 128, 256, 512, 512];
            its "wide" type: [64, 128, 256, 512, 1024]).
        normalize: tasks whose prediction is L2-normalised over channels (the reference's surface normals);
            names that are not tasks of the task set are ignored (Cityscapes has no normal task).
        """
        widths = check_filters(filters)
        channels = check_image_shape(input_shape, len(widths), "SegNet")
        normalized = check_normalize(normalize)
        trunk = SegNetTrunk(channels, widths)
        task_heads: dict[str, nn.Module] = {
            name: prediction_head(widths[0], int(out), name in normalized) for name, out in heads.items()
        }
        super().__init__(trunk, task_heads, last_shared_layer=trunk.last_conv)
        init_weights(self)
