"""MTL architectures around any backbone that declares its stages (chosen with `model/arch=<name>`)."""

from mtl_bench.models.archs.base import Architecture, Backbone
from mtl_bench.models.archs.cgc import CGC
from mtl_bench.models.archs.cross_stitch import CrossStitch
from mtl_bench.models.archs.dselect_k import DSelectK
from mtl_bench.models.archs.hps import HPS
from mtl_bench.models.archs.ltb import LTB
from mtl_bench.models.archs.mmoe import MMoE
from mtl_bench.models.archs.mtan import MTAN
from mtl_bench.models.archs.ple import PLE

__all__ = ["CGC", "HPS", "LTB", "Architecture", "Backbone", "CrossStitch", "DSelectK", "MMoE", "MTAN", "PLE"]
