"""Multi-task models: a shared part and one head per task (see `MultiTaskModel`)."""

from mtl_bench.models.base import ModelOutput, MultiTaskModel
from mtl_bench.models.lenet import LeNet
from mtl_bench.models.mlp import MLP
from mtl_bench.models.segnet import SegNet
from mtl_bench.models.segnet_mtan import SegNetMTAN

__all__ = ["LeNet", "MLP", "ModelOutput", "MultiTaskModel", "SegNet", "SegNetMTAN"]
