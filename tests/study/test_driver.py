"""The study driver reads each run's metrics.json once, and again after the run trains (also when the launch that
trained it was interrupted: index.json then says what finished)."""

from __future__ import annotations

import json

import pytest

from mtl_bench.records import RunRecord, Status
from mtl_bench.study import launch
from mtl_bench.study.driver import Study
from mtl_bench.study.spec import load_study

TASKS = [f"t{i}" for i in range(10)]


def test_each_record_is_read_once_and_again_after_its_run_trains(tmp_path, monkeypatch):
    study = Study(load_study("toy10", [f"dir={tmp_path}"]), [], TASKS)
    done, other = study.tuning[0], study.tuning[1]
    (study.runs_dir / done.id).mkdir(parents=True)
    RunRecord(Status.COMPLETED, step=1, overrides=done.overrides).write(study.runs_dir / done.id)
    reads = []
    read = RunRecord.read
    monkeypatch.setattr(RunRecord, "read", staticmethod(lambda run_dir: reads.append(run_dir) or read(run_dir)))
    for _ in range(3):
        assert study.status(done) == "completed" and study.record(done).completed
    assert len(reads) == 1

    def interrupted(todo, runs_dir, launcher, resume):
        assert [run.id for run in todo] == [other.id]  # the finished run is not trained again
        (runs_dir / other.id).mkdir(parents=True)
        RunRecord(Status.DIVERGED, step=3).write(runs_dir / other.id)
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "launch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        study.run_phase("tune", [done, other])
    study.write_index()
    index = {run["id"]: run["status"] for run in json.loads((tmp_path / "index.json").read_text())["runs"]}
    assert index[done.id] == "completed" and index[other.id] == "diverged"
    assert study.status(study.tuning[2]) == "not started"
