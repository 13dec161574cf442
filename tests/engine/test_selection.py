"""select=<option>: the reported evaluation is the papers' (final, best validation epoch, mean of the last k)."""

from __future__ import annotations

import json

import pytest
import torch

from mtl_bench.engine.recipe import train
from mtl_bench.engine.selection import BestVal, LastK, eval_steps
from mtl_bench.errors import ConfigError
from tests.helpers.cli import SMALL

HIGHER = {"a": {"loss": False, "acc": True}, "b": {"loss": False, "acc": True}}


def test_best_val_keeps_the_state_of_the_best_evaluation_and_last_k_the_mean():
    model = torch.nn.Linear(1, 1)
    best = BestVal(HIGHER, None, eval_steps(30, 10), criterion="acc")
    for step, acc in ((10, 0.5), (20, 0.9), (30, 0.7)):
        with torch.no_grad():
            model.weight.fill_(step)
        best.observe(step, {"a": {"loss": 1.0, "acc": acc}, "b": {"loss": 1.0, "acc": acc}}, None, model)
    assert best.best_step == 20 and best.best_state["weight"].item() == 20
    assert best.record() == {"select": "best_val", "criterion": "acc", "step": 20, "val_score": -0.9}
    restored = BestVal(HIGHER, None, eval_steps(30, 10), criterion="acc")
    restored.load_state_dict(best.state_dict())
    assert (restored.best_step, restored.best_val) == (20, best.best_val)

    last = LastK(HIGHER, None, eval_steps(25, 10), k=2)
    assert eval_steps(25, 10) == [10, 20, 25] and [last.wants_test(s) for s in (10, 20, 25)] == [False, True, True]
    last.observe(20, {}, {"a": {"acc": 0.5}}, model)
    last.observe(25, {}, {"a": {"acc": 0.7}}, model)
    assert last.mean() == {"a": {"acc": pytest.approx(0.6)}}


def test_a_criterion_is_checked_when_the_selection_is_made():
    with pytest.raises(ConfigError, match="select.criterion=delta_m needs tasks.reference"):
        BestVal(HIGHER, None, [5, 10], criterion="delta_m")
    with pytest.raises(ConfigError, match="select.criterion='f1': allowed: delta_m, a metric"):
        BestVal(HIGHER, None, [5, 10], criterion="f1")
    delta = BestVal(HIGHER, {"a": {"acc": 0.5}}, [5, 10], criterion="delta_m")
    assert delta.score({"a": {"acc": 0.6, "loss": 1.0}}) == pytest.approx(-20.0)  # 20% better than the reference


def test_select_options_are_checked_and_named(compose_cfg):
    from mtl_bench.engine.builders import build
    from mtl_bench.engine.selection import ModelSelection

    with pytest.raises(ValueError, match=r"^k: must be an integer >= 1, got 0$"):
        LastK(HIGHER, None, [5, 10], k=0)
    node = compose_cfg("select=last_k", "select.k=0").select
    with pytest.raises(ConfigError, match=r"^select.k: must be an integer >= 1, got 0$"):
        build("select", node, ModelSelection, higher_is_better=HIGHER, reference=None, eval_steps=[5, 10])


def test_best_val_reports_the_test_metrics_of_the_best_evaluation(compose_cfg, tmp_path):
    """The selected test metrics equal those of a run stopped at the selected step (same seed, constant lr).
    At lr 0.05 task t0's validation loss is best at step 5 of 20, so the best state is not the final one."""
    args = ("select=best_val", "select.criterion=t0/loss", "trainer.eval_every=5", "optim.lr=0.05")
    chosen = train(compose_cfg(*SMALL, *args), tmp_path / "best")
    record = json.loads((tmp_path / "best" / "metrics.json").read_text())
    step = record["model_selection"]["step"]
    assert record["model_selection"]["select"] == "best_val" and step == 5
    stopped = train(compose_cfg(*SMALL, "trainer.max_steps=5", "optim.lr=0.05"), tmp_path / "stopped")
    for split in ("test", "val"):
        for task, values in getattr(stopped, split).items():
            assert getattr(chosen, split)[task] == pytest.approx(values, rel=1e-6), (split, task)


def test_last_k_reports_the_mean_test_metrics_of_the_last_k_evaluations(compose_cfg, tmp_path):
    mean = train(compose_cfg(*SMALL, "select=last_k", "select.k=2"), tmp_path / "mean")
    at_10 = train(compose_cfg(*SMALL, "trainer.max_steps=10"), tmp_path / "10").test
    at_20 = train(compose_cfg(*SMALL), tmp_path / "20").test
    for task in at_20:
        for name in at_20[task]:
            assert mean.test[task][name] == pytest.approx((at_10[task][name] + at_20[task][name]) / 2, rel=1e-6)
