"""Model selection as the papers do it (`select=<option>`): which evaluation a run reports.

final: the last step's val and test metrics. best_val: the test metrics of the evaluation whose val metrics are
best by `select.criterion` (Nash-MTL's and FAMO's QM9 and CelebA protocols: the epoch with the best validation Δm
or F1). last_k: the mean test metrics of the last `select.k` evaluations (the nash-mtl README's NYUv2 protocol: the
mean over the last 10 epochs). Selection never changes what is trained.

A rule is a `ModelSelection` built from conf/select/<option>.yaml by `_target_`; the engine supplies the task set's
`higher_is_better` and `reference` and the steps it evaluates at (`eval_steps`). A user's own rule subclasses it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import torch

from mtl_bench.analysis.criterion import score
from mtl_bench.balancers.checks import number  # the options' range checks, one line naming the option
from mtl_bench.engine.callbacks import Callback
from mtl_bench.engine.evaluate import log_metrics

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import Recipe, TrainResult

Metrics = dict[str, dict[str, float]]
HigherIsBetter = Mapping[str, Mapping[str, bool]]
Reference = Optional[Mapping[str, Mapping[str, float]]]


def eval_steps(total: int, every: int) -> list[int]:
    """The steps the loop evaluates at: every `every` steps and the last."""
    steps = list(range(every, total, every))
    return steps + [total]


class ModelSelection:
    """The interface, and `select=final`: the last evaluation is the one reported.

    The loop calls `wants_test(step)` before each evaluation (test is evaluated where it says so, and at the end),
    `observe(...)` after it, and `selected(...)` once at the end; `record()` goes into metrics.json and the state
    into checkpoints."""

    name = "final"

    def __init__(self, higher_is_better: HigherIsBetter, reference: Reference, eval_steps: Sequence[int]) -> None:
        """higher_is_better: each task's metrics and whether higher is better; reference: the task set's
        reference numbers (None without); eval_steps: the steps the loop evaluates at (the engine gives all three)."""
        self.higher_is_better, self.reference, self.eval_steps = higher_is_better, reference, list(eval_steps)

    def wants_test(self, step: int) -> bool:
        """Whether the loop evaluates test at this evaluation (it always does at the last)."""
        return False

    def observe(self, step: int, val: Metrics, test: Optional[Metrics], model: torch.nn.Module) -> None:
        """An evaluation's metrics (test is None where it was not evaluated)."""

    def selected(
        self, val: Metrics, test: Metrics, model: torch.nn.Module, evaluate_test: Callable[[str], Metrics]
    ) -> tuple[Metrics, Metrics]:
        """The val and test metrics the run reports, from the last evaluation's; `evaluate_test(label)` evaluates
        the model as it is now on test (logged under `label`)."""
        return val, test

    def record(self) -> dict[str, Any]:
        """What metrics.json says of the selection."""
        return {"select": self.name}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class Final(ModelSelection):
    """select=final: the interface's own behaviour."""


class BestVal(ModelSelection):
    """The test metrics of the evaluation with the best val `criterion`; the first of equal scores wins, as the
    references' strict `<`."""

    name = "best_val"

    def __init__(
        self,
        higher_is_better: HigherIsBetter,
        reference: Reference,
        eval_steps: Sequence[int],
        criterion: str = "delta_m",
    ) -> None:
        """criterion: delta_m (against tasks.reference) | <metric> (its mean over tasks) | <task>/<metric>.
        higher_is_better: each task's metrics and whether higher is better; reference: the task set's
        reference numbers (None without); eval_steps: the steps the loop evaluates at (the engine gives all three)."""
        super().__init__(higher_is_better, reference, eval_steps)
        self.criterion = criterion
        self.best_score = math.inf  # the criterion as a cost: lower is better
        self.best_step = -1
        self.best_state: dict[str, torch.Tensor] | None = None
        self.best_val: Metrics = {}
        self.score({t: {m: 1.0 for m in names} for t, names in higher_is_better.items()})  # checks the criterion

    def score(self, val: Metrics) -> float:
        return score(val, self.criterion, self.higher_is_better, self.reference, "select.criterion")

    def observe(self, step: int, val: Metrics, test: Optional[Metrics], model: torch.nn.Module) -> None:
        value = self.score(val)
        if value < self.best_score:
            self.best_score, self.best_step, self.best_val = value, step, val
            self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def selected(
        self, val: Metrics, test: Metrics, model: torch.nn.Module, evaluate_test: Callable[[str], Metrics]
    ) -> tuple[Metrics, Metrics]:
        """The best state's test metrics; the final model is put back (it stays in the checkpoint)."""
        if self.best_step in (-1, self.eval_steps[-1]) or self.best_state is None:
            return val, test
        final = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(self.best_state)
        try:
            best_test = evaluate_test(f"test (best val {self.criterion} at step {self.best_step})")
        finally:
            model.load_state_dict(final)
        return self.best_val, best_test

    def record(self) -> dict[str, Any]:
        return {"select": self.name, "criterion": self.criterion, "step": self.best_step, "val_score": self.best_score}

    def state_dict(self) -> dict[str, Any]:
        return {
            "best_score": self.best_score,
            "best_step": self.best_step,
            "best_state": self.best_state,
            "best_val": self.best_val,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best_score, self.best_step = float(state["best_score"]), int(state["best_step"])
        self.best_state, self.best_val = state["best_state"], dict(state["best_val"])


class LastK(ModelSelection):
    """The mean test metrics of the last k evaluations (fewer when the run evaluates fewer times)."""

    name = "last_k"

    def __init__(
        self, higher_is_better: HigherIsBetter, reference: Reference, eval_steps: Sequence[int], k: int = 10
    ) -> None:
        """k: how many evaluations to average (> 0).
        higher_is_better: each task's metrics and whether higher is better; reference: the task set's
        reference numbers (None without); eval_steps: the steps the loop evaluates at (the engine gives all three)."""
        number("k", k, 1, integer=True)
        super().__init__(higher_is_better, reference, eval_steps)
        self.k = k
        self.last_k_steps = set(self.eval_steps[-k:])
        self.sums: Metrics = {}
        self.count = 0

    def wants_test(self, step: int) -> bool:
        return step in self.last_k_steps

    def observe(self, step: int, val: Metrics, test: Optional[Metrics], model: torch.nn.Module) -> None:
        if test is None or step not in self.last_k_steps:
            return
        for task, values in test.items():
            for name, value in values.items():
                self.sums.setdefault(task, {})[name] = self.sums.get(task, {}).get(name, 0.0) + value
        self.count += 1

    def mean(self) -> Metrics:
        return {task: {name: v / self.count for name, v in values.items()} for task, values in self.sums.items()}

    def selected(
        self, val: Metrics, test: Metrics, model: torch.nn.Module, evaluate_test: Callable[[str], Metrics]
    ) -> tuple[Metrics, Metrics]:
        return val, self.mean()

    def record(self) -> dict[str, Any]:
        return {"select": self.name, "k": self.k, "evaluations": self.count}

    def state_dict(self) -> dict[str, Any]:
        return {"sums": self.sums, "count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sums, self.count = {t: dict(v) for t, v in state["sums"].items()}, int(state["count"])


class Selection(Callback):
    """The loop's side of a rule: test where it asks, each evaluation observed, the reported metrics at the end;
    its state in the checkpoint under `selection`."""

    state_key = "selection"

    def __init__(self, rule: ModelSelection) -> None:
        self.rule = rule

    def wants_test(self, step: int) -> bool:
        return self.rule.wants_test(step)

    def on_eval_end(self, run: Recipe, val: Metrics, test: Optional[Metrics]) -> None:
        self.rule.observe(run.step, val, test, run.model)

    def on_fit_end(self, run: Recipe, result: TrainResult) -> None:
        """The val and test metrics the run reports; the final model stays in the checkpoint."""

        def evaluate_test(label: str) -> Metrics:
            metrics = run.evaluate("test")
            log_metrics(run.step, label, metrics)
            return metrics

        result.val, result.test = self.rule.selected(result.val, result.test, run.model, evaluate_test)

    def state_dict(self) -> dict[str, Any]:
        return self.rule.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rule.load_state_dict(state)
