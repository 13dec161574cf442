"""Task sets: data made, shipped or read locally, with each task's loss and metrics (see `TaskSet`)."""

from mtl_bench.tasks.base import Split, Task, TaskSet
from mtl_bench.tasks.digits import Digits
from mtl_bench.tasks.toy import ToyRegression

__all__ = ["Digits", "Split", "Task", "TaskSet", "ToyRegression"]
