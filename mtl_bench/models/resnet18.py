"""ResNet-18 encoder with a shared hidden layer and one linear classifier per task: the Office-31/Office-Home model of
LibMTL's tables (median-research-group/LibMTL 4336804: examples/office/main.py `Encoder` and `decoders`, on
LibMTL/model/resnet.py's `resnet18`, its copy of torchvision's without avgpool and fc).

The reference's encoder is ResNet-18 (ImageNet-pretrained in its runs), global average pooling, then a hidden layer
Linear(512, 512) + BatchNorm1d + ReLU + Dropout(0.5) whose Linear starts at weight N(0, 0.005²), bias 0.1; each task's
decoder is Linear(512, classes). Here the backbone is `torchvision.models.resnet18`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping, Optional, Sequence

from torch import nn

from mtl_bench.models.base import MultiTaskModel
from mtl_bench.models.resnet_dilated import ENCODER, check_rgb_shape
from mtl_bench.models.torchvision_weights import load_backbone_weights
from mtl_bench.optional import torchvision_module

FEATURES = 512  # ResNet-18's pooled features


class ResNet18(MultiTaskModel):
    """ResNet-18 + pooled hidden layer (shared) + one linear head per task (LibMTL's Office-31/Office-Home model, HPS).

    The trunk is one Sequential: torchvision's ResNet-18 up to layer4 (its parameter names: `trunk.conv1.weight`,
    ...), global average pooling, flatten, then `hidden` (Linear), `hidden_bn` (BatchNorm1d), ReLU and dropout.
    `shared` is the hidden layer's output (N, hidden) and `last_shared_layer` its Linear. Each head is
    Linear(hidden, classes): predictions are logits (N, classes). Any (3, H, W) input works (adaptive pooling); the
    Office task sets use (3, 224, 224). The hidden BatchNorm1d needs training batches of 2 or more images.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        hidden: int = 512,
        dropout: float = 0.5,
        weights: Optional[str] = None,
        arch: Any = None,
    ) -> None:
        """
        input_shape: one sample's (3, height, width) (given by the engine from the task set).
        heads: each task's number of classes (given by the engine from the task set).
        hidden: width of the shared hidden layer after pooling (> 0; LibMTL's `hidden_dim` 512).
        dropout: dropout probability after the hidden layer, in [0, 1) (LibMTL's 0.5).
        weights: path of a torchvision ResNet-18 state dict to start the encoder from (ImageNet: resnet18-f37072fd.pth,
            torchvision.models.ResNet18_Weights.IMAGENET1K_V1; its `fc.*` is ignored); null: random init, logged.
        arch: the architecture around the trunk (`model/arch=<name>`; null or hps: hard sharing). Stages: stem +
            layer1, layer2, layer3, layer4 + the pooled hidden layer; every column or expert loads `weights`.
        """
        torchvision_module(NEEDED_BY)  # first: the install line comes before any shape error
        check_rgb_shape(input_shape, "ResNet18")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0:
            raise ValueError(f"hidden: must be an integer > 0, got {hidden!r}")
        if isinstance(dropout, bool) or not 0 <= dropout < 1:
            raise ValueError(f"dropout: must be in [0, 1), got {dropout!r}")
        trunk, linear = _trunk(hidden, dropout, weights)
        task_heads: dict[str, nn.Module] = {name: nn.Linear(hidden, int(classes)) for name, classes in heads.items()}
        super().__init__(
            trunk,
            task_heads,
            last_shared_layer=linear,
            stages=STAGES + (len(trunk),),
            stem=4,  # conv1, bn1, relu, maxpool
            make_trunk=lambda: _trunk(hidden, dropout, weights)[0],
            input_shape=input_shape,
            arch=arch,
        )


NEEDED_BY = "ResNet18 (model=resnet18)"
# Stages for architectures: stem + layer1 | layer2 | layer3 | layer4 + pooled hidden layer (LibMTL's cuts).
STAGES = (5, 6, 7)


def _trunk(hidden: int, dropout: float, weights: Optional[str]) -> tuple[nn.Sequential, nn.Linear]:
    backbone = torchvision_module(NEEDED_BY).models.resnet18(weights=None)
    load_backbone_weights(backbone, weights, "resnet18")
    linear = nn.Linear(FEATURES, hidden)
    nn.init.normal_(linear.weight, 0.0, 0.005)  # the reference's `weight.data.normal_(0, 0.005)`
    nn.init.constant_(linear.bias, 0.1)  # and `bias.data.fill_(0.1)`
    layers = [(name, getattr(backbone, name)) for name in ENCODER]
    layers += [
        ("avgpool", nn.AdaptiveAvgPool2d(1)),
        ("flatten", nn.Flatten()),
        ("hidden", linear),
        ("hidden_bn", nn.BatchNorm1d(hidden)),
        ("hidden_relu", nn.ReLU()),
        ("dropout", nn.Dropout(dropout)),
    ]
    return nn.Sequential(OrderedDict(layers)), linear
