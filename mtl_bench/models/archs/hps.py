"""Hard parameter sharing (Caruana, ICML 1993; LibMTL 1.1.5 architecture/HPS.py): one trunk, one head per task."""

from __future__ import annotations

from torch import nn

from mtl_bench.models.archs.base import Backbone


def HPS(backbone: Backbone) -> nn.Sequential:  # noqa: N802  (named like the other architectures' classes)
    """Hard parameter sharing: the backbone's trunk itself (today's models, parameter names `trunk.*` unchanged).

    backbone: the backbone's trunk and stages (given by the model).
    """
    return backbone.trunk
