"""Task sets: data made, shipped or read locally, with each task's loss and metrics (see `TaskSet`)."""

from mtl_bench.tasks.base import Split, Task, TaskSet
from mtl_bench.tasks.cagrad_toy import CAGradToy
from mtl_bench.tasks.celeba import CelebA
from mtl_bench.tasks.cityscapes import Cityscapes
from mtl_bench.tasks.digits import Digits
from mtl_bench.tasks.nyuv2 import NYUv2
from mtl_bench.tasks.office31 import Office31
from mtl_bench.tasks.office_home import OfficeHome
from mtl_bench.tasks.pareto_toy import ParetoToy
from mtl_bench.tasks.qm9 import QM9
from mtl_bench.tasks.toy import ToyRegression

__all__ = [
    "CAGradToy",
    "CelebA",
    "Cityscapes",
    "Digits",
    "NYUv2",
    "Office31",
    "OfficeHome",
    "ParetoToy",
    "QM9",
    "Split",
    "Task",
    "TaskSet",
    "ToyRegression",
]
