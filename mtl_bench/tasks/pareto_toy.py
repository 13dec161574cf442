"""Lin et al., NeurIPS 2019, "Pareto Multi-Task Learning", section 5 synthetic example (Xi-L/ParetoMTL 0407f35
synthetic_example/run_synthetic_example.py `f1`, `f2`, its `n_dim = 20`).

Two objectives of x in R^d, f1(x) = 1 − exp(−‖x − a‖²) and f2(x) = 1 − exp(−‖x + a‖²) with a = 1/√d·1 (‖a‖ = 1).
Their Pareto set is the segment x = s·a, s ∈ [−1, 1], where ‖x ∓ a‖² = (1 ∓ s)², so the true front is
F(s) = (1 − exp(−(1 − s)²), 1 − exp(−(1 + s)²)) whatever d is. It is concave, which is why Lin et al. chose it: a
linear scalarization Σ r_i f_i reaches only its two ends.

There is no data: the model's output is the point x (`model=decision`), every split holds `samples` copies of one
constant input feature (1.0), so every row of a batch gives the same losses and a preference-conditioned model that
appends r to its input (`model/front=cosmos` with `model.hidden`) reads r alone.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Mapping, Optional

import torch
from torch import Tensor

from mtl_bench.tasks.base import Split, Task, TaskSet

TASKS = ("f1", "f2")


class ParetoToy(TaskSet):
    """Tasks "f1", "f2"; each task's prediction is x (N, dim); loss and metric "f": the objective's batch mean.

    `true_front(n)`: n points of the true Pareto front (task order), s evenly spaced in [−1, 1]; the engine records
    them in metrics.json (`true_front`) so the report measures fronts against the truth (docs/known_answers.md).
    """

    def __init__(
        self,
        dim: int = 20,
        samples: int = 128,
        reference: Optional[Mapping[str, Mapping[str, float]]] = None,
    ) -> None:
        """
        dim: the dimension d of x (>= 1; Lin et al.'s code: 20).
        samples: rows in each split (>= 1), all the same constant input; the default fits trainer.batch_size=128.
        reference: single-task metrics {task: {metric: value}} for `mtl-bench report -b reference`.
        """
        for key, value in (("dim", dim), ("samples", samples)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}: must be an integer >= 1, got {value!r}")
        self.dim = dim
        centre = torch.full((dim,), 1.0 / math.sqrt(dim))
        tasks = [
            Task(
                name=name,
                out_dim=dim,
                loss=partial(objective_loss, centre=sign * centre),
                metrics=partial(objective_metrics, centre=sign * centre),
                higher_is_better={"f": False},
            )
            for name, sign in zip(TASKS, (1.0, -1.0))
        ]
        splits = {
            split: Split(inputs=torch.ones(samples, 1), targets={name: torch.zeros(samples, 1) for name in TASKS})
            for split in ("train", "val", "test")
        }
        super().__init__(tasks, (1,), reference=reference, **splits)

    @staticmethod
    def true_front(n: int) -> list[list[float]]:
        """n >= 2 points of the true front, (f1, f2) at s = −1 ... 1 evenly spaced along the Pareto set."""
        return [list(front_point(-1.0 + 2.0 * i / (n - 1))) for i in range(n)]


def front_point(s: float) -> tuple[float, float]:
    """(f1, f2) at x = s·a."""
    return 1.0 - math.exp(-((1.0 - s) ** 2)), 1.0 - math.exp(-((1.0 + s) ** 2))


def _values(x: Tensor, centre: Tensor) -> Tensor:
    """Each row's 1 − exp(−‖x − centre‖²)."""
    return 1.0 - torch.exp(-(x - centre.to(x)).pow(2).sum(dim=1))


def objective_loss(pred: Tensor, target: Tensor, centre: Tensor) -> Tensor:
    """The batch mean of the objective (the target is not read: there is no data)."""
    return _values(pred, centre).mean()


def objective_metrics(pred: Tensor, target: Tensor, centre: Tensor) -> dict[str, Tensor]:
    """ "f": the batch's sum of the objective."""
    return {"f": _values(pred.detach(), centre).sum()}
