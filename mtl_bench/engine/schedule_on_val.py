"""A learning-rate schedule stepped by a validation criterion (optim/schedule=plateau, torch's ReduceLROnPlateau):
the loop's callback that gives it each val evaluation's `optim.schedule.criterion`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mtl_bench.engine.callbacks import Callback
from mtl_bench.engine.selection import score

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import Metrics, Recipe


class ScheduleOnVal(Callback):
    """For a schedule with `validation_step(cost)` and `criterion` (delta_m, a metric, <task>/<metric>)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def on_eval(self, run: Recipe, split: str, metrics: Metrics) -> None:
        if split == "val":
            key = "optim.schedule.criterion"
            cost = score(metrics, self.scheduler.criterion, run.higher_is_better, run.taskset.reference, key)
            self.scheduler.validation_step(cost)
