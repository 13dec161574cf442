"""Preference-conditioned models around any backbone (chosen with `model/front=<name>`): one trained model answers
every trade-off between the tasks (docs/pareto_front.md)."""

from mtl_bench.models.fronts.base import PreferenceModel
from mtl_bench.models.fronts.cosmos_net import COSMOS
from mtl_bench.models.fronts.pamal import PaMaL
from mtl_bench.models.fronts.phn import PHN

__all__ = ["COSMOS", "PHN", "PaMaL", "PreferenceModel"]
