"""Dilated ResNet-50 encoder with one DeepLab (ASPP) head per task: the NYUv2/Cityscapes "DeepLabV3+" model of LibMTL's
tables (median-research-group/LibMTL 4336804: LibMTL/model/resnet_dilated.py, examples/nyu/aspp.py and main.py).

The reference's encoder is its own copy of torchvision's ResNet-50 without avgpool and fc, with the strides of layer3
and layer4 replaced by dilation (`dilate_scale=8`: output stride 8); its heads are torchvision's DeepLabV3 head
(ASPP with rates 12, 24, 36, then conv 3x3 + BN + ReLU + conv 1x1); its trainer (`process_preds`) upsamples every
prediction bilinearly (align_corners=True) to the image size. Here the backbone is
`torchvision.models.resnet50(replace_stride_with_dilation=...)`, which dilates the same convolutions by the same
rates, and the heads are `torchvision.models.segmentation.deeplabv3.DeepLabHead`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping, Optional, Sequence

from torch import nn

from mtl_bench.models.base import MultiTaskModel
from mtl_bench.models.segnet import ChannelNormalize, check_normalize
from mtl_bench.models.torchvision_weights import load_backbone_weights
from mtl_bench.optional import torchvision_module

NEEDED_BY = "ResNetDilated (model=resnet_dilated)"
ENCODER = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")  # torchvision's names, in order
FEATURES = 2048  # ResNet-50's last stage: the heads' input channels
OUTPUT_STRIDES = {8: [False, True, True], 16: [False, False, True]}  # replace_stride_with_dilation per output stride


def check_rgb_shape(input_shape: Sequence[int], model: str) -> tuple[int, int]:
    """(height, width) of a (3, height, width) input: torchvision's ResNets take RGB images."""
    if len(input_shape) != 3:
        raise ValueError(f"input_shape: {model} needs (channels, height, width), got {tuple(input_shape)!r}")
    channels, height, width = (int(n) for n in input_shape)
    if channels != 3 or height <= 0 or width <= 0:
        raise ValueError(f"input_shape: {model} takes RGB images (3, height, width), got {tuple(input_shape)!r}")
    return height, width


def dense_head(out_channels: int, rates: Sequence[int], size: tuple[int, int], normalize: bool) -> nn.Sequential:
    """torchvision's DeepLabHead (LibMTL's `DeepLabHead(2048, out)`: modules 0-4, the same parameter names), then
    the bilinear upsampling to the image size (LibMTL's `process_preds`) and, for `normalize`, unit length over
    channels."""
    deeplabv3 = torchvision_module(NEEDED_BY, "torchvision.models.segmentation.deeplabv3")
    head = deeplabv3.DeepLabHead(FEATURES, out_channels, atrous_rates=tuple(rates))
    head.append(nn.Upsample(size=size, mode="bilinear", align_corners=True))
    if normalize:
        head.append(ChannelNormalize())
    return head


class ResNetDilated(MultiTaskModel):
    """Dilated ResNet-50 (shared) + one DeepLab ASPP head per task (LibMTL's NYUv2/Cityscapes model, HPS).

    The trunk is torchvision's ResNet-50 up to layer4 (its parameter names: `trunk.conv1.weight`, `trunk.layer4.2.
    conv3.weight`, ... as LibMTL's encoder), strides of layer3 and layer4 replaced by dilation; `shared` is its last
    feature map (2048 channels at 1/8 of the input size) and `last_shared_layer` its last convolution
    (layer4[-1].conv3; only BatchNorm's affine parameters follow it). Each head: ASPP (a 1x1 branch, one 3x3 branch per
    atrous rate, image pooling; 256 channels each, projected to 256 with dropout 0.5), conv 3x3 + BN + ReLU, conv 1x1
    to the task's channels, then bilinear upsampling (align_corners=True) to the input_shape's size. Predictions are
    (N, C_task, H, W): segmentation logits (LibMTL's as well), depth raw, tasks in `normalize` of unit length.

    The image-pooling branch has BatchNorm on a 1x1 map: training needs batches of 2 or more images (as LibMTL's).
    With `weights` null the encoder starts from random initialisation (LibMTL's and torchvision's init): LibMTL's
    numbers use ImageNet weights, passed as a local torchvision file.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        output_stride: int = 8,
        atrous_rates: Sequence[int] = (12, 24, 36),
        normalize: Sequence[str] = ("normal",),
        weights: Optional[str] = None,
        arch: Any = None,
    ) -> None:
        """
        input_shape: one sample's (3, height, width) (given by the engine from the task set); predictions are
            upsampled to (height, width).
        heads: each task's output channels (given by the engine from the task set).
        output_stride: 8 (layer3 and layer4 dilated, LibMTL's `dilate_scale=8`, its default and its NYUv2 model) or
            16 (layer4 only, `dilate_scale=16`).
        atrous_rates: dilation of each 3x3 ASPP branch, one or more (LibMTL's and DeepLabV3's [12, 24, 36] at
            output stride 8; DeepLabV3 uses [6, 12, 18] at 16).
        normalize: tasks whose prediction is L2-normalised over channels (surface normals; LibMTL normalises in
            its normal loss and metric, as the task sets here do, so the numbers are the same either way); names
            that are not tasks of the task set are ignored.
        weights: path of a torchvision ResNet-50 state dict to start the encoder from (ImageNet: resnet50-0676ba61.pth,
            torchvision.models.ResNet50_Weights.IMAGENET1K_V1; its `fc.*` is ignored); null: random init, logged.
        arch: the architecture around the trunk (`model/arch=<name>`; null or hps: hard sharing). Stages: stem +
            layer1, layer2, layer3, layer4 (LibMTL's cuts); every column or expert loads `weights`.
        """
        torchvision_module(NEEDED_BY)  # first: the install line comes before any shape error
        size = check_rgb_shape(input_shape, "ResNetDilated")
        if isinstance(output_stride, bool) or output_stride not in OUTPUT_STRIDES:
            raise ValueError(f"output_stride: must be 8 or 16, got {output_stride!r}")
        rates = [int(r) for r in atrous_rates] if not isinstance(atrous_rates, (str, int)) else []
        if not rates or any(r <= 0 or r != given for r, given in zip(rates, atrous_rates)):
            raise ValueError(f"atrous_rates: need one or more integer dilations > 0, got {atrous_rates!r}")
        normalized = check_normalize(normalize)
        trunk = _trunk(output_stride, weights)
        task_heads: dict[str, nn.Module] = {
            name: dense_head(int(out), rates, size, name in normalized) for name, out in heads.items()
        }
        super().__init__(
            trunk,
            task_heads,
            last_shared_layer=trunk.get_submodule("layer4.2.conv3"),  # the last block's last convolution
            stages=(5, 6, 7, 8),  # stem + layer1 | layer2 | layer3 | layer4 (LibMTL's cuts)
            stem=4,  # conv1, bn1, relu, maxpool
            make_trunk=lambda: _trunk(output_stride, weights),
            input_shape=input_shape,
            arch=arch,
        )


def _trunk(output_stride: int, weights: Optional[str]) -> nn.Sequential:
    torchvision = torchvision_module(NEEDED_BY)
    backbone = torchvision.models.resnet50(weights=None, replace_stride_with_dilation=OUTPUT_STRIDES[output_stride])
    load_backbone_weights(backbone, weights, "resnet50")
    return nn.Sequential(OrderedDict((name, getattr(backbone, name)) for name in ENCODER))
