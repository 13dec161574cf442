"""Task sets: data made or shipped locally, with each task's loss and metrics."""

from typing import Callable

from mtl_bench.tasks.base import Split, Task, TaskSet
from mtl_bench.tasks.digits import make_digits
from mtl_bench.tasks.toy import make_toy

TASK_SETS: dict[str, Callable[..., TaskSet]] = {"toy": make_toy, "digits": make_digits}

__all__ = ["Split", "Task", "TaskSet", "TASK_SETS", "make_digits", "make_toy"]
