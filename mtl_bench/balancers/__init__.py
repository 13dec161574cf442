"""Loss balancers: each turns {task: loss} into gradients (see `Balancer`)."""

from mtl_bench.balancers.aggregator import Aggregation, Aggregator, StepInfo
from mtl_bench.balancers.aligned_mtl import AlignedMTL
from mtl_bench.balancers.auto_lambda import AutoLambda
from mtl_bench.balancers.cagrad import CAGrad
from mtl_bench.balancers.con_fig import ConFIG
from mtl_bench.balancers.cosmos import COSMOS
from mtl_bench.balancers.cr_mogm import CRMOGM
from mtl_bench.balancers.db_mtl import DualBalancing
from mtl_bench.balancers.dualproj import DualProj
from mtl_bench.balancers.dwa import DynamicWeightAverage
from mtl_bench.balancers.excess_mtl import ExcessMTL
from mtl_bench.balancers.fairgrad import FairGrad
from mtl_bench.balancers.famo import FAMO
from mtl_bench.balancers.fixed import FixedWeights
from mtl_bench.balancers.forum import FORUM
from mtl_bench.balancers.gls import GeometricLoss
from mtl_bench.balancers.graddrop import GradDrop
from mtl_bench.balancers.gradnorm import GradNorm
from mtl_bench.balancers.gradvac import GradVac
from mtl_bench.balancers.imtl import IMTL
from mtl_bench.balancers.krum import Krum
from mtl_bench.balancers.linear import LinearScalarization
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.mgda import MGDA
from mtl_bench.balancers.moco import MoCo
from mtl_bench.balancers.modo import MoDo
from mtl_bench.balancers.moml import MOML
from mtl_bench.balancers.nash_mtl import NashMTL
from mtl_bench.balancers.pbi import PenaltyBoundaryIntersection
from mtl_bench.balancers.pcd import PCD
from mtl_bench.balancers.pcgrad import PCGrad
from mtl_bench.balancers.rescaled_norm import RescaledNormBalancer
from mtl_bench.balancers.rlw import RandomLossWeighting
from mtl_bench.balancers.sdmgrad import SDMGrad
from mtl_bench.balancers.si import ScaleInvariant
from mtl_bench.balancers.stch import SmoothTchebycheff
from mtl_bench.balancers.trimmed_mean import TrimmedMean
from mtl_bench.balancers.upgrad import UPGrad
from mtl_bench.balancers.uw import UncertaintyWeighting
from mtl_bench.balancers.validation_source import ValidationSource, needs_validation
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.balancer import BackwardContext, Balancer
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer

__all__ = [
    "BackwardContext",
    "Balancer",
    "GramianBalancer",
    "Solution",
    "ValidationSource",
    "Weighting",
    "Aggregator",
    "Aggregation",
    "StepInfo",
    "LossWeighting",
    "needs_validation",
    "AlignedMTL",
    "AutoLambda",
    "CAGrad",
    "DualBalancing",
    "DynamicWeightAverage",
    "FAMO",
    "FORUM",
    "FixedWeights",
    "GradDrop",
    "GradNorm",
    "GradVac",
    "IMTL",
    "MGDA",
    "NashMTL",
    "PCGrad",
    "RandomLossWeighting",
    "RescaledNormBalancer",
    "UPGrad",
    "UncertaintyWeighting",
    "COSMOS",
    "GeometricLoss",
    "PenaltyBoundaryIntersection",
    "ScaleInvariant",
    "SmoothTchebycheff",
    "ConFIG",
    "DualProj",
    "Krum",
    "LinearScalarization",
    "FairGrad",
    "TrimmedMean",
    "ExcessMTL",
    "PCD",
    "CRMOGM",
    "MoCo",
    "MoDo",
    "MOML",
    "SDMGrad",
]
