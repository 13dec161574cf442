"""Loss balancers: each turns {task: loss} into gradients (see `Balancer`)."""

from mtl_bench.balancers.base import BackwardContext, Balancer
from mtl_bench.balancers.fixed import FixedWeights
from mtl_bench.balancers.gradnorm import GradNorm
from mtl_bench.balancers.pcgrad import PCGrad
from mtl_bench.balancers.rescaled_norm import RescaledNormBalancer

__all__ = ["BackwardContext", "Balancer", "FixedWeights", "GradNorm", "PCGrad", "RescaledNormBalancer"]
