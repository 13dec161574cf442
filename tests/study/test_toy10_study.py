"""`study=toy10` end to end: every planned run is an ordinary run directory, the single-task runs train one task
and feed Δm, selection reads validation only, a killed study resumes without retraining finished runs, a changed
plan is refused, peak memory is in metrics.json, and the report prints the table."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from mtl_bench.analysis.delta_m import delta_m_flat, relative_drops
from mtl_bench.errors import ConfigError, Interrupted
from mtl_bench.records import RunRecord
from mtl_bench.study import launch
from mtl_bench.study.driver import Study, run_study
from mtl_bench.study.spec import load_study
from tests.helpers.cli import cli, run_cli

TASKS = [f"t{i}" for i in range(10)]


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    """One complete toy10 study, shared by the tests below (they copy it before changing anything)."""
    root = tmp_path_factory.mktemp("toy10")
    return run_study("toy10", [f"dir={root / 'study'}"])


def copy_of(study_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "study"
    shutil.copytree(study_dir, target)
    return target


def read_record(run_dir: Path) -> dict | None:
    """A run's metrics.json as the study reads it (RunRecord), as the file's keys."""
    record = RunRecord.read(run_dir)
    return None if record is None else record.to_dict()


def records(study_dir: Path) -> dict[str, dict]:
    index = json.loads((study_dir / "index.json").read_text())["runs"]
    return {run["id"]: read_record(study_dir / run["dir"]) for run in index}


def test_every_planned_run_completed_as_an_ordinary_run(study_dir):
    index = json.loads((study_dir / "index.json").read_text())["runs"]
    assert len(index) == 2 * 14 * 2  # (10 single-task + equal + scalarization + uw + dwa) x (2 trials + 2 seeds)
    assert {run["status"] for run in index} == {"completed"}
    for run in index:
        run_dir = study_dir / run["dir"]
        assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "train.log").is_file()
        assert read_record(run_dir)["overrides"] == run["overrides"]
    plan = (study_dir / "study.yaml").read_text()
    assert "tuning_runs" in plan and "budget: 2" in plan
    results = json.loads((study_dir / "study.json").read_text())
    assert set(results["rows"]) == {"equal", "scalarization", "uw", "dwa", "single_task"}
    assert results["verdict"].startswith("verdict: ")


def test_single_task_runs_train_one_task_and_are_the_reference(study_dir):
    found = records(study_dir)
    results = json.loads((study_dir / "study.json").read_text())
    for task in TASKS:
        finals = [r for i, r in found.items() if i.startswith(f"final/single_task-{task}/")]
        assert len(finals) == 2
        for record in finals:
            assert list(record["test"]) == [task] and list(record["higher_is_better"]) == [task]
        mean = sum(r["test"][task]["mse"] for r in finals) / 2
        assert results["reference"]["test"][task]["mse"] == pytest.approx(mean)
    # a row's Δm per seed is the flat Δm of its final run against that reference
    uw = found["final/uw/s1"]
    expected = delta_m_flat(
        relative_drops(
            {t: {"mse": m["mse"]} for t, m in uw["test"].items()}, results["reference"]["test"], uw["higher_is_better"]
        )
    )
    assert results["rows"]["uw"]["delta_m_per_seed"]["1"] == pytest.approx(expected)
    assert results["reference"]["kind"] == "single_task"


def test_peak_memory_is_in_every_metrics_json(study_dir):
    for record in records(study_dir).values():
        peak = record["peak_memory"]
        assert peak["kind"] == "cpu_peak_rss" and peak["label"] == "CPU process peak RSS" and peak["bytes"] > 2**20


def test_every_run_logs_to_its_train_log_and_the_process_keeps_its_loggers(study_dir):
    # Hydra's `hydra_logging=disabled` disables every logger that exists (dictConfig's disable_existing_loggers):
    # the study's later runs, and whatever the process does after the study, would log nothing.
    assert not logging.getLogger("mtl_bench").disabled
    for run in json.loads((study_dir / "index.json").read_text())["runs"]:
        log = (study_dir / run["dir"] / "train.log").read_text()
        assert "][mtl_bench" in log, run["dir"]


def test_selection_never_reads_test_metrics(study_dir, tmp_path):
    """Scramble every tuning run's test metrics: the same trials are chosen."""
    before = json.loads((study_dir / "study.json").read_text())["chosen"]
    copy = copy_of(study_dir, tmp_path)
    for metrics in (copy / "runs" / "tune").rglob("metrics.json"):
        record = json.loads(metrics.read_text())
        record["test"] = {t: {m: -1e9 for m in ms} for t, ms in record["test"].items()}
        metrics.write_text(json.dumps(record))
    cfg = load_study("toy10", [f"dir={copy}"])
    chosen = Study(cfg, [], TASKS).select()
    assert {row: {"trial": run.id, "settings": run.settings} for row, run in chosen.items()} == before


def test_a_killed_study_resumes_without_retraining_finished_runs(study_dir, tmp_path, monkeypatch, capsys):
    copy = copy_of(study_dir, tmp_path)
    (copy / "study.json").unlink()
    killed = ["tune/uw/t01", "final/dwa/s2", "final/single_task-t3/s1"]
    for run_id in killed:  # as a kill leaves them: the run dir without metrics.json
        (copy / "runs" / run_id / "metrics.json").unlink()
    kept = {i: r["finished_at"] for i, r in records(copy).items() if r}
    started = []

    def interrupted(cfg):
        started.append(1)
        raise KeyboardInterrupt  # Ctrl-C as the first relaunched job starts

    monkeypatch.setattr(launch, "study_job", interrupted)
    capsys.readouterr()
    with pytest.raises(Interrupted):
        run_study("toy10", [f"dir={copy}"])
    assert started == [1]
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        f"mtl-bench: study interrupted between runs; {copy / 'index.json'} is current. Resume the study with: "
        f"mtl-bench study toy10 dir={copy}"
    ]
    index = {run["id"]: run["status"] for run in json.loads((copy / "index.json").read_text())["runs"]}
    assert index["tune/uw/t01"] == "incomplete" and index["tune/uw/t00"] == "completed"
    assert "MTL_BENCH_RESUME_HINT" not in os.environ
    monkeypatch.undo()
    run_study("toy10", [f"dir={copy}"])
    after = records(copy)
    assert all(after[i]["status"] == "completed" for i in killed)
    assert {i: after[i]["finished_at"] for i in kept} == kept  # finished runs were not trained again
    assert "trainer.resume=auto" in after["tune/uw/t01"]["overrides"]
    assert (
        json.loads((copy / "study.json").read_text())["chosen"]
        == json.loads((study_dir / "study.json").read_text())["chosen"]
    )


def test_a_changed_plan_is_refused_with_one_line(study_dir, tmp_path):
    copy = copy_of(study_dir, tmp_path)
    with pytest.raises(ConfigError, match=r"planned with study.budget=2, this command gives 3"):
        run_study("toy10", [f"dir={copy}", "budget=3"])
    result = run_cli("study", "toy10", f"dir={copy}", "space.optim.lr={loguniform:[0.001,0.1]}")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "planned with study.space.optim.lr.loguniform" in result.stderr


def test_the_study_report(study_dir, tmp_path):
    result = run_cli("report", str(study_dir))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0].split()[:4] == ["method", "n", "test", "Δm"]
    assert lines[2].split()[:2] == ["equal", "2/2"]
    assert any(line.startswith("MDE: the minimum detectable effect") for line in lines)
    assert [line.split()[0] for line in lines[2:7]] == ["equal", "scalarization", "uw", "dwa", "single-task"]
    assert any(line.startswith("verdict: ") for line in lines)
    markdown = run_cli("report", str(study_dir), "--format", "markdown", "--plots", str(tmp_path / "plots"))
    assert markdown.returncode == 0 and markdown.stdout.startswith("| method |")
    assert list((tmp_path / "plots").glob("*.png"))
    as_json = json.loads(run_cli("report", str(study_dir), "--format", "json").stdout)
    assert as_json["rows"]["uw"]["vs_scalarization"]["n"] == 2
    csv = run_cli("report", str(study_dir), "--format", "csv").stdout.splitlines()
    assert csv[0].startswith("method,n,seeds_planned,delta_m,delta_m_ci95,") and len(csv) == 6
    uw = next(line.split(",") for line in csv if line.startswith("uw,"))
    assert float(uw[3]) == pytest.approx(as_json["rows"]["uw"]["delta_m"]["mean"])  # numbers, not display strings
    runs = run_cli("report", str(study_dir / "runs" / "final" / "uw"))  # the ordinary report shows peak memory too
    assert runs.returncode == 0 and "peak MiB" in runs.stdout and "(CPU process peak RSS)" in runs.stdout
    refused = run_cli("report", str(study_dir), "--wide")
    assert refused.returncode == 2 and refused.stderr.startswith("mtl-bench: error: --baseline, --published")


@pytest.mark.slow  # joblib's worker processes start torch anew: minutes on a busy 2-core machine
def test_a_study_resumes_with_another_launcher(study_dir, tmp_path):
    """The launcher is not part of the plan: runs missing from a study started with the basic launcher are
    trained by joblib's workers, as `mtl-bench train -m hydra/launcher=joblib` would."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    copy = copy_of(study_dir, tmp_path)
    for run_id in ("tune/dwa/t00", "final/uw/s2"):
        shutil.rmtree(copy / "runs" / run_id)
    kept = {i: r["finished_at"] for i, r in records(copy).items() if r}
    result = cli("study", "toy10", f"dir={copy}", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert result.returncode == 0, result.stderr[-2000:]
    after = records(copy)
    assert after["tune/dwa/t00"]["status"] == after["final/uw/s2"]["status"] == "completed"
    assert {i: after[i]["finished_at"] for i in kept} == kept
