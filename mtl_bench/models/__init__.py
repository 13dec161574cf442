"""Multi-task models: a shared part and one head per task (see `MultiTaskModel`)."""

from mtl_bench.models.base import ModelOutput, MultiTaskModel
from mtl_bench.models.celeba_cnn import CelebACNN
from mtl_bench.models.decision import DecisionVariables
from mtl_bench.models.lenet import LeNet
from mtl_bench.models.mlp import MLP
from mtl_bench.models.mpnn import MPNN
from mtl_bench.models.resnet18 import ResNet18
from mtl_bench.models.resnet_dilated import ResNetDilated
from mtl_bench.models.segnet import SegNet
from mtl_bench.models.segnet_mtan import SegNetMTAN

__all__ = [
    "CelebACNN",
    "DecisionVariables",
    "LeNet",
    "MLP",
    "MPNN",
    "ModelOutput",
    "MultiTaskModel",
    "ResNet18",
    "ResNetDilated",
    "SegNet",
    "SegNetMTAN",
]
