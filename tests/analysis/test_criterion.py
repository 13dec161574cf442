"""The one selection-criterion grammar: what it parses, the cost it gives on a tiny case, and the one-line refusals
of the engine (select.criterion) and the study (select=)."""

from __future__ import annotations

import pytest

from mtl_bench.analysis.criterion import Criterion, criterion_cost, parse_criterion, score
from mtl_bench.errors import ConfigError

HIB = {"a": {"acc": True, "loss": False}, "b": {"mse": False, "loss": False}}
VAL = {"a": {"acc": 0.8, "loss": 0.5}, "b": {"mse": 2.0, "loss": 1.5}}


def test_the_grammar():
    assert parse_criterion("delta_m") == Criterion("delta_m")
    assert parse_criterion("a/acc") == Criterion("a/acc", "acc", "a")
    assert parse_criterion("loss") == Criterion("loss", "loss", None)
    for bad in ("loss", "a/b/c", "/acc", "a/"):
        with pytest.raises(ConfigError, match=rf"^select={bad}: allowed: delta_m or <task>/<metric>$"):
            parse_criterion(bad, "select", per_task_only=True)


def test_the_cost_is_lower_for_better():
    assert criterion_cost(VAL, parse_criterion("a/acc"), HIB, None) == -0.8  # higher is better: negated
    assert criterion_cost(VAL, parse_criterion("b/mse"), HIB, None) == 2.0
    assert criterion_cost(VAL, parse_criterion("loss"), HIB, None) == pytest.approx((0.5 + 1.5) / 2)  # mean of tasks
    # Δm against a reference: acc 0.8 vs 1.0 is a 20% drop, mse 2.0 vs 1.0 a 100% rise: (20 + 100) / 2
    reference = {"a": {"acc": 1.0}, "b": {"mse": 1.0}}
    assert criterion_cost(VAL, parse_criterion("delta_m"), HIB, reference) == pytest.approx(60.0)
    assert score(VAL, "delta_m", HIB, reference, "select.criterion") == pytest.approx(60.0)


def test_the_engine_names_its_key_and_what_is_allowed():
    with pytest.raises(ConfigError, match="^select.criterion=delta_m needs tasks.reference"):
        score(VAL, "delta_m", HIB, None, "select.criterion")
    with pytest.raises(
        ConfigError, match=r"^optim.schedule.criterion='f1': allowed: delta_m, a metric \(acc, loss, mse\)"
    ):
        score(VAL, "f1", HIB, None, "optim.schedule.criterion")
