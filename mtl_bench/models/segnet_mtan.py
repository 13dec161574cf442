"""SegNet with task attention: the Multi-Task Attention Network (MTAN; Liu, Johns & Davison, "End-to-End
Multi-Task Learning with Attention", CVPR 2019), the NYUv2/Cityscapes model of the Nash-MTL, CAGrad and FAMO
tables.

The reference is MTAN's `im2im_pred/model_segnet_mtan.py` and its copy `_SegNet`/`SegNetMtan` in Nash-MTL's and
FAMO's `experiments/{nyuv2,cityscapes}/models.py` (lorenmt/mtan c36c30b, AvivNavon/nash-mtl cce1840,
Cranial-XIX/FAMO 0a6ad06).
"""

from __future__ import annotations

from typing import Iterator, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtl_bench.models.base import ModelOutput, MultiTaskModel
from mtl_bench.models.segnet import (
    FILTERS,
    SegNetFeatures,
    SegNetTrunk,
    check_filters,
    check_image_shape,
    check_normalize,
    conv_layer,
    init_weights,
    prediction_head,
)


def attention_layer(in_channels: int, mid_channels: int, out_channels: int) -> nn.Sequential:
    """The reference's `att_layer`: conv 1x1 + BN + ReLU + conv 1x1 + BN + sigmoid: a soft mask in (0, 1)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, mid_channels, 1),
        nn.BatchNorm2d(mid_channels),
        nn.ReLU(inplace=True),
        nn.Conv2d(mid_channels, out_channels, 1),
        nn.BatchNorm2d(out_channels),
        nn.Sigmoid(),
    )


def decoder_channels(filters: Sequence[int], stage: int) -> int:
    """Output channels of the decoder stage that mirrors encoder stage `stage`."""
    return filters[max(stage - 1, 0)]


class SharedAttentionBlocks(nn.Module):
    """The conv layers of the attention path that every task shares (the reference's `encoder_block_att`,
    `decoder_block_att`; in its `shared_modules()`): encoder stage j maps filters[j] -> filters[j+1] (the last
    stage keeps its width); decoder module j maps the previous attention features to the width of decoder stage j."""

    def __init__(self, filters: Sequence[int]) -> None:
        super().__init__()
        f, n = list(filters), len(filters)
        self.encoder_block_att = nn.ModuleList([conv_layer(f[j], f[min(j + 1, n - 1)]) for j in range(n)])
        self.decoder_block_att = nn.ModuleList(
            [conv_layer(f[j], f[j] if j == n - 1 else decoder_channels(f, j)) for j in range(n)]
        )


class TaskAttention(nn.Module):
    """One task's attention modules (the reference's `encoder_att[task]`, `decoder_att[task]`), one per stage.

    Encoder stage j: mask from [encoder block output, previous attention features] (stage 0: the block
    output alone), applied to the stage's conv block output. Decoder stage (mirroring encoder stage j): mask
    from [unpooled input, upsampled attention features], applied to the stage's conv block output.
    """

    def __init__(self, filters: Sequence[int]) -> None:
        super().__init__()
        f, n = list(filters), len(filters)
        self.encoder_att = nn.ModuleList([attention_layer(f[j] if j == 0 else 2 * f[j], f[j], f[j]) for j in range(n)])
        # The decoder stage mirroring encoder stage j reads [its unpooled input (f[j] channels), the attention
        # features after decoder_block_att[j]]: f[j] + f[j-1] (2 f[0] at j = 0). At the deepest stage the
        # reference writes f[n-1] + f[n-2] for what is 2 f[n-1] (its decoder_block_att keeps the width there);
        # the two agree for its filters (512, 512), and 2 f[n-1] is what runs for any other widths.
        in_channels = [f[j] + decoder_channels(f, j) if j < n - 1 else 2 * f[j] for j in range(n)]
        self.decoder_att = nn.ModuleList(
            [attention_layer(in_channels[j], decoder_channels(f, j), decoder_channels(f, j)) for j in range(n)]
        )

    def forward(self, g: SegNetFeatures, blocks: SharedAttentionBlocks) -> Tensor:
        n = len(g.encoder)
        att: Optional[Tensor] = None
        for j, (first, second) in enumerate(g.encoder):
            mask = self.encoder_att[j](first if att is None else torch.cat((first, att), dim=1))
            att = F.max_pool2d(blocks.encoder_block_att[j](mask * second), kernel_size=2, stride=2)
        assert att is not None
        for i, (up, (_, out)) in enumerate(zip(g.unpooled, g.decoder)):
            j = n - 1 - i  # the encoder stage this decoder stage mirrors
            att = F.interpolate(att, scale_factor=2, mode="bilinear", align_corners=True)
            att = blocks.decoder_block_att[j](att)
            att = self.decoder_att[j](torch.cat((up, att), dim=1)) * out
        return att


class SegNetMTAN(MultiTaskModel):
    """SegNet-MTAN: the shared SegNet (`SegNetTrunk`) plus, per task, attention modules that read the shared
    features at every encoder and decoder stage and a conv head (conv 3x3 + conv 1x1) on the task's last
    attended features. Predictions are (N, C_task, H, W) at the input resolution:

    - segmentation: logits. The reference returns log_softmax and trains with NLL; the task set's
      cross-entropy on logits (ignoring -1) is the same loss, and argmax (mIoU, pixel accuracy) is the same.
    - depth: raw, as the reference.
    - tasks in `normalize` (default: normal): L2-normalised over channels, as the reference's normal output.

    Shared parameters: the SegNet and the attention path's shared conv layers (`encoder_block_att`,
    `decoder_block_att`), plus, with `attention_in_shared=true` (the default), every task's attention modules,
    as Nash-MTL's and FAMO's `SegNetMtan.shared_parameters()` (every parameter but the prediction heads): the
    gradient methods then take each task's gradient over them too (task i's attention rows are 0 for the other
    tasks). `attention_in_shared=false`: they are task parameters (MTAN's and CAGrad's `shared_modules()`).

    `shared` is the decoder's last feature map and `last_shared_layer` the decoder's last conv. The predictions
    depend on the shared parameters through every stage's features, not only through `shared`: the gradient
    balancers detect this in the autograd graph and take the per-task gradients at the shared parameters through
    all paths (one batched vector-Jacobian product from the losses); methods defined at the shared
    representation (grad_source=shared_rep of the gradient methods, GradDrop) refuse this model with an error.
    GradNorm's and RescaledNorm's shared_rep measure the gradient at `shared`, the last shared map.

    At the default widths the model has the reference's parameters (a test checks the count).
    """

    trunk: SegNetTrunk

    def __init__(
        self,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        filters: Sequence[int] = FILTERS,
        attention_in_shared: bool = True,
        normalize: Sequence[str] = ("normal",),
    ) -> None:
        """
        input_shape: one sample's (channels, height, width) (given by the engine from the task set); height
            and width must be divisible by 2^len(filters) (32 with the default five stages).
        heads: each task's output channels (given by the engine from the task set).
        filters: channels of each encoder stage, one entry per stage (the reference's [64, 128, 256, 512, 512]).
        attention_in_shared: count the per-task attention modules among the shared parameters, as Nash-MTL and
            FAMO do (true), or among each task's own parameters, as MTAN's and CAGrad's code do (false).
        normalize: tasks whose prediction is L2-normalised over channels (the reference's surface normals);
            names that are not tasks of the task set are ignored (Cityscapes has no normal task).
        """
        widths = check_filters(filters)
        channels = check_image_shape(input_shape, len(widths), "SegNetMTAN")
        normalized = check_normalize(normalize)
        if not isinstance(attention_in_shared, bool):
            raise ValueError(f"attention_in_shared: must be true or false, got {attention_in_shared!r}")
        trunk = SegNetTrunk(channels, widths)
        task_heads: dict[str, nn.Module] = {
            name: prediction_head(widths[0], int(out), name in normalized) for name, out in heads.items()
        }
        super().__init__(trunk, task_heads, last_shared_layer=trunk.last_conv)
        self.attention_blocks = SharedAttentionBlocks(widths)
        self.attention = nn.ModuleDict({name: TaskAttention(widths) for name in heads})
        self.attention_in_shared = attention_in_shared
        init_weights(self)

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        yield from self.trunk.parameters()
        yield from self.attention_blocks.parameters()
        if self.attention_in_shared:
            yield from self.attention.parameters()

    def task_parameters(self, task: str) -> Iterator[nn.Parameter]:
        if not self.attention_in_shared:
            yield from self.attention[task].parameters()
        yield from self.heads[task].parameters()

    def forward(self, x: Tensor, tasks: Optional[Sequence[str]] = None) -> ModelOutput:
        """Predictions of every task, or only of `tasks` (their attention paths alone run)."""
        g = self.trunk.features(x)
        names = self.heads.keys() if tasks is None else tasks
        preds = {name: self.heads[name](self.attention[name](g, self.attention_blocks)) for name in names}
        return ModelOutput(shared=g.decoder[-1][1], preds=preds)
