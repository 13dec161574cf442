"""study.json's numbers from records made by hand: ranks over every task (not the first record's), outcomes that are
never dropped, the power of each comparison and the three verdicts."""

from __future__ import annotations

import statistics

import pytest

from mtl_bench.analysis.stats import mean_ranks
from mtl_bench.records import RunRecord
from mtl_bench.study.results import summarize

SEEDS = [1, 2, 3]
HIB = {"a": {"acc": True}, "b": {"mse": False}}


def record(acc: float, mse: float) -> dict:
    return {
        "status": "completed",
        "test": {"a": {"acc": acc, "loss": 1.0}, "b": {"mse": mse, "loss": mse}},
        "higher_is_better": HIB,
        "wall_time_s": 10.0,
        "step": 100,
    }


def single(task: str, value: float) -> dict:
    metric = "acc" if task == "a" else "mse"
    return {"status": "completed", "test": {task: {metric: value}}, "higher_is_better": {task: HIB[task]}}


def study(finals: dict[str, list[dict | None]], min_effect: float = 2.0, not_learned=None) -> dict:
    index, records = [], {}
    for task, value in (("a", 0.9), ("b", 1.0)):  # the single-task runs come first, as in a study's index
        index.append({"id": f"tune/single_task-{task}/t00", "phase": "tune", "row": f"single_task-{task}", "seed": 0})
        records[f"tune/single_task-{task}/t00"] = RunRecord.from_dict(single(task, value))
    for row, runs in finals.items():
        for seed, rec in zip(SEEDS, runs):
            run_id = f"final/{row}/s{seed}"
            index.append({"id": run_id, "phase": "final", "row": row, "seed": seed})
            records[run_id] = None if rec is None else RunRecord.from_dict(rec)
    return summarize(
        index,
        records,
        reference_kind="single_task",
        reference_test={"a": {"acc": 0.9}, "b": {"mse": 1.0}},
        rows=list(finals),
        seeds=SEEDS,
        not_learned=not_learned,
        min_effect=min_effect,
    )


def test_ranks_use_every_task_even_when_a_single_task_run_comes_first():
    finals = {
        "scalarization": [record(0.80, 1.0), record(0.81, 1.1), record(0.79, 0.9)],  # best on a, middle on b
        "x": [record(0.70, 0.5), record(0.71, 0.6), record(0.69, 0.4)],  # worst on a, best on b
        "y": [record(0.75, 2.0), record(0.76, 2.1), record(0.74, 1.9)],  # middle on a, worst on b
    }
    rows = study(finals)["rows"]
    means = [rows[r]["test_mean"] for r in finals]
    expected = mean_ranks(means, HIB)
    assert [rows[r]["mean_rank"] for r in finals] == expected == [1.5, 2.0, 2.5]  # task a alone: 1, 3, 2


def test_outcomes_are_counted_not_dropped_and_one_seed_has_no_interval():
    diverged = {"status": "diverged", "reason": "non-finite"}
    finals = {
        "scalarization": [record(0.80, 1.0), record(0.82, 1.2), record(0.79, 0.9)],
        "x": [record(0.70, 0.5), diverged, None],
    }
    rows = study(finals, not_learned={"final/scalarization/s3": "no task's training loss fell"})["rows"]
    assert rows["x"]["delta_m"]["n"] == 1 and rows["x"]["seeds_planned"] == 3
    assert rows["x"]["outcomes"] == {"2": "diverged", "3": "not run"}
    assert rows["x"]["delta_m"]["ci95"] is None
    assert rows["x"]["vs_scalarization"]["p"] is None and rows["x"]["vs_scalarization"]["detectable"] is None
    assert rows["scalarization"]["delta_m"]["n"] == 3  # a run that did not learn counts, flagged
    assert rows["scalarization"]["outcomes"] == {"3": "did not learn"}


def test_power_and_the_verdicts():
    base = [record(0.80, 1.0), record(0.82, 1.2), record(0.79, 0.9)]
    close = [record(0.801, 1.0), record(0.821, 1.21), record(0.789, 0.9)]  # differences of about 0.1 Δm points
    result = study({"scalarization": base, "x": close}, min_effect=5.0)
    vs = result["rows"]["x"]["vs_scalarization"]
    diffs = [
        result["rows"]["x"]["delta_m_per_seed"][s] - result["rows"]["scalarization"]["delta_m_per_seed"][s]
        for s in ("1", "2", "3")
    ]
    assert vs["sd"] == pytest.approx(statistics.stdev(diffs))
    from mtl_bench.analysis.stats import detectable_difference

    assert vs["detectable"] == pytest.approx(detectable_difference(vs["sd"], 3, 0.05))
    assert result["verdict"].startswith("verdict: no method beat tuned scalarization by more than")
    noisy = [record(0.70, 0.5), record(0.85, 1.9), record(0.79, 0.9)]
    result = study({"scalarization": base, "x": noisy}, min_effect=1.0)
    assert (
        result["verdict"].startswith("verdict: inconclusive")
        and "seeds would resolve a difference of 1" in (result["verdict"])
    )
    assert result["power"]["seeds_for_min_effect"] > 3
