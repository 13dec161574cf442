"""Hard-parameter-sharing models: a shared trunk and one head per task."""

from typing import Callable

from mtl_bench.models.base import ModelOutput, MultiTaskModel
from mtl_bench.models.lenet import build_lenet
from mtl_bench.models.mlp import build_mlp

MODELS: dict[str, Callable[..., MultiTaskModel]] = {"mlp": build_mlp, "lenet": build_lenet}

__all__ = ["MODELS", "ModelOutput", "MultiTaskModel", "build_lenet", "build_mlp"]
