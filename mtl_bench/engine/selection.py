"""Model selection as the papers do it (`trainer.select`): which evaluation a run reports.

final: the last step's val and test metrics. best_val: the test metrics of the evaluation whose val metrics are
best by `trainer.select_criterion` (Nash-MTL's and FAMO's QM9 and CelebA protocols: the epoch with the best
validation Δm or F1). last_k: the mean test metrics of the last `select_k` evaluations (the nash-mtl README's
NYUv2 protocol: the mean over the last 10 epochs). Selection never changes what is trained.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import torch

from mtl_bench.errors import ConfigError
from mtl_bench.report.delta_m import delta_m_flat, relative_drops

Metrics = dict[str, dict[str, float]]


def eval_steps(total: int, every: int) -> list[int]:
    """The steps the loop evaluates at: every `every` steps and the last."""
    steps = list(range(every, total, every))
    return steps + [total]


class Selection:
    """Follows the run's evaluations and keeps what `select` needs: the best val state or the last k test metrics."""

    def __init__(
        self,
        select: str,
        criterion: str,
        k: int,
        higher_is_better: Mapping[str, Mapping[str, bool]],
        reference: Optional[Mapping[str, Mapping[str, float]]],
        total_steps: int,
        eval_every: int,
    ) -> None:
        self.select, self.criterion, self.k = select, criterion, k
        self.higher_is_better, self.reference = higher_is_better, reference
        self.last_k_steps = set(eval_steps(total_steps, eval_every)[-k:]) if select == "last_k" else set()
        self.best_score = math.inf  # the criterion as a cost: lower is better
        self.best_step = -1
        self.best_state: dict[str, torch.Tensor] | None = None
        self.best_val: Metrics = {}
        self.sums: Metrics = {}
        self.count = 0
        if select == "best_val":
            self.score({t: {m: 1.0 for m in names} for t, names in higher_is_better.items()})  # checks the criterion

    def score(self, val: Metrics, criterion: Optional[str] = None, key: str = "trainer.select_criterion") -> float:
        """`criterion` (the selection's by default) on `val` as a cost (lower is better); `key` names the setting
        in errors."""
        criterion = criterion or self.criterion
        if criterion == "delta_m":
            if not self.reference:
                raise ConfigError(
                    f"{key}=delta_m needs tasks.reference (single-task numbers); choose a metric instead, e.g. "
                    f"{key}=loss"
                )
            return delta_m_flat(relative_drops(val, self.reference, self.higher_is_better))
        task, _, metric = criterion.rpartition("/")
        tasks = [task] if task else [t for t in self.higher_is_better if metric in self.higher_is_better[t]]
        known = {m for names in self.higher_is_better.values() for m in names}
        if not tasks or any(metric not in self.higher_is_better.get(t, {}) for t in tasks):
            raise ConfigError(
                f"{key}={criterion!r}: allowed: delta_m, a metric ({', '.join(sorted(known))})"
                f" or <task>/<metric> with a task of {', '.join(self.higher_is_better)}"
            )
        values = [val[t][metric] * (-1.0 if self.higher_is_better[t][metric] else 1.0) for t in tasks]
        return sum(values) / len(values)

    def wants_test(self, step: int) -> bool:
        """Whether the loop should evaluate test at this evaluation (last_k only)."""
        return step in self.last_k_steps

    def observe(self, step: int, val: Metrics, test: Optional[Metrics], model: torch.nn.Module) -> None:
        if self.select == "best_val":
            score = self.score(val)
            if score < self.best_score:  # the first of equal scores wins, as the references' strict `<`
                self.best_score, self.best_step, self.best_val = score, step, val
                self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        elif self.select == "last_k" and test is not None:
            for task, values in test.items():
                for name, value in values.items():
                    self.sums.setdefault(task, {})[name] = self.sums.get(task, {}).get(name, 0.0) + value
            self.count += 1

    def last_k_mean(self) -> Metrics:
        return {task: {name: v / self.count for name, v in values.items()} for task, values in self.sums.items()}

    def record(self) -> dict[str, Any]:
        """What metrics.json says of the selection."""
        if self.select == "best_val":
            return {
                "select": "best_val",
                "criterion": self.criterion,
                "step": self.best_step,
                "val_score": self.best_score,
            }
        if self.select == "last_k":
            return {"select": "last_k", "k": self.k, "evaluations": self.count}
        return {"select": "final"}

    def state_dict(self) -> dict[str, Any]:
        return {
            "best_score": self.best_score,
            "best_step": self.best_step,
            "best_state": self.best_state,
            "best_val": self.best_val,
            "sums": self.sums,
            "count": self.count,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best_score, self.best_step = float(state["best_score"]), int(state["best_step"])
        self.best_state, self.best_val = state["best_state"], dict(state["best_val"])
        self.sums, self.count = {t: dict(v) for t, v in state["sums"].items()}, int(state["count"])
