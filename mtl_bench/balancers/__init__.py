"""Loss balancers: each turns {task: loss} into gradients (see `Balancer`)."""

from mtl_bench.balancers.base import Balancer
from mtl_bench.balancers.fixed import FixedWeights

__all__ = ["Balancer", "FixedWeights"]
