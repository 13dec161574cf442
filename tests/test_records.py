"""metrics.json through RunRecord: what runs write today reads and writes back unchanged (key order too), an
unknown status or key survives the round trip, and a missing or unreadable file reads as documented."""

from __future__ import annotations

import json

from mtl_bench.errors import DivergedError
from mtl_bench.records import METRICS_FILE, RunRecord, Status, previous_status, record_failure

# A completed run's metrics.json as the engine writes it (Recipe.metrics_record), keys in the file's order.
COMPLETED = {
    "status": "completed",
    "step": 40,
    "wall_time_s": 1.25,
    "overrides": ["balancer=fixed", "seed=1"],
    "choices": {"balancer": "fixed", "tasks": "toy"},
    "seed": 1,
    "val": {"a": {"loss": 0.5, "mse": 0.5}},
    "test": {"a": {"loss": 0.4, "mse": 0.4}},
    "summary": {"test_loss_ratio_sum": 0.8},
    "initial_test": {"a": {"loss": 0.5, "mse": 0.5}},
    "higher_is_better": {"a": {"loss": False, "mse": False}},
    "model_selection": {"select": "final"},
    "implementations": {},
    "reference": None,
    "peak_memory": {"bytes": 2**20, "kind": "cpu_peak_rss", "label": "CPU process peak RSS"},
    "threads": 2,
    "device": "cpu",
    "finished_at": "2026-11-29T02:00:00",
}
FAILED = {
    "status": "failed",
    "error": "ValueError: bad",
    "reason": "bad",
    "step": 3,
    "overrides": [],
    "choices": {"balancer": "fixed"},
}


def test_what_runs_write_today_round_trips_key_for_key(tmp_path):
    keys = list(COMPLETED)
    at = keys.index("reference") + 1  # a front run's `front` comes after `reference`
    front = {k: COMPLETED[k] for k in keys[:at]} | {"front": {"rays": [[1.0]]}} | {k: COMPLETED[k] for k in keys[at:]}
    for data in (COMPLETED, FAILED, {**front, "an_older_key": [1, 2]}):
        record = RunRecord.from_dict(json.loads(json.dumps(data)))
        assert list(record.to_dict().items()) == list(data.items())
        record.write(tmp_path)
        assert list(json.loads((tmp_path / METRICS_FILE).read_text()).items()) == list(data.items())
        assert RunRecord.read(tmp_path) == record
    record = RunRecord.from_dict(COMPLETED)
    assert record.status is Status.COMPLETED and record.completed and record.finished
    assert record.test == {"a": {"loss": 0.4, "mse": 0.4}} and record.split("val")["a"]["mse"] == 0.5


def test_a_record_built_here_writes_what_a_completed_run_always_holds():
    built = RunRecord(Status.COMPLETED, step=1, wall_time_s=0.5, test={"a": {"loss": 1.0}})
    written = built.to_dict()
    assert written["status"] == "completed" and written["reference"] is None and written["val"] is None
    assert "front" not in written and "error" not in written  # optional keys only when set
    assert list(written)[:3] == ["status", "step", "wall_time_s"]


def test_an_unknown_status_reads_as_unknown_and_is_written_back_as_it_was():
    record = RunRecord.from_dict({**FAILED, "status": "preempted_by_a_newer_version"})
    assert record.status is Status.UNKNOWN and not record.completed and not record.finished
    assert record.status_name == "preempted_by_a_newer_version"
    assert record.to_dict()["status"] == "preempted_by_a_newer_version"
    assert RunRecord.from_dict({"test": {}}).status is Status.INCOMPLETE  # no status: a run not finished


def test_a_missing_file_is_none_and_an_unreadable_one_a_failed_record(tmp_path):
    assert RunRecord.read(tmp_path) is None and previous_status(tmp_path) is None
    (tmp_path / METRICS_FILE).write_text("{not json")
    record = RunRecord.read(tmp_path)
    assert record is not None and record.status is Status.FAILED and record.error.startswith("unreadable metrics.json")
    (tmp_path / METRICS_FILE).write_text("[1, 2]")
    assert RunRecord.read(tmp_path).status is Status.FAILED


def test_record_failure_names_the_outcome_and_never_overwrites_a_completed_run(tmp_path):
    record_failure(tmp_path, DivergedError("loss is nan"), 7, ["seed=1"], {"balancer": "fixed"})
    written = json.loads((tmp_path / METRICS_FILE).read_text())
    assert list(written) == ["status", "error", "reason", "step", "overrides", "choices"]
    assert written["status"] == "diverged" and written["step"] == 7 and previous_status(tmp_path) is Status.DIVERGED
    RunRecord.from_dict(COMPLETED).write(tmp_path)
    record_failure(tmp_path, ValueError("late"), 9, [], {})
    assert RunRecord.read(tmp_path).status is Status.COMPLETED
    assert f"{Status.DIVERGED}" == str(Status.DIVERGED) == "diverged" == Status.DIVERGED  # a str: older callers hold
