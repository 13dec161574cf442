"""`mtl-bench report`: groups over seeds, Δm in both conventions, formats, failed runs, plots."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtl_bench.cli import app
from mtl_bench.errors import ConfigError
from mtl_bench.report.delta_m import delta_m_flat, delta_m_task_averaged, relative_drops
from mtl_bench.report.main import make_report

HIB = {"a": {"loss": False, "acc": True, "err": False}, "b": {"loss": False, "mse": False}}


def write_run(root: Path, name: str, overrides: list[str], test: dict, status: str = "completed",
              choices: dict | None = None) -> Path:
    run = root / name
    run.mkdir(parents=True)
    metrics = {"status": status, "overrides": overrides, "choices": choices or {"balancer": "fixed", "tasks": "toy"},
               "higher_is_better": HIB}
    if status == "completed":
        metrics["test"] = test
    else:
        metrics["error"] = "RuntimeError: boom"
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def values(acc: float, err: float, mse: float) -> dict:
    return {"a": {"loss": 1.0, "acc": acc, "err": err}, "b": {"loss": mse, "mse": mse}}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "multirun"
    fixed = {"balancer": "fixed", "tasks": "toy"}
    gradnorm = {"balancer": "gradnorm", "tasks": "toy"}
    write_run(root, "0", ["balancer=fixed", "seed=0"], values(0.74, 0.26, 1.0), choices=fixed)
    write_run(root, "1", ["balancer=fixed", "seed=1"], values(0.76, 0.24, 1.0), choices=fixed)
    write_run(root, "2", ["balancer=gradnorm", "balancer.alpha=0.5", "seed=0"], values(0.78, 0.21, 1.2),
              choices=gradnorm)
    write_run(root, "3", ["balancer=gradnorm", "balancer.alpha=0.5", "seed=1"], values(0.82, 0.19, 1.0),
              choices=gradnorm)
    write_run(root, "4", ["balancer=gradnorm", "balancer.alpha=0.5", "seed=2"], {}, status="failed", choices=gradnorm)
    killed = root / "5" / ".hydra"
    killed.mkdir(parents=True)
    (killed / "overrides.yaml").write_text("- balancer=fixed\n- seed=2\n")
    return root


def test_delta_m_conventions_on_a_hand_computed_case():
    drops = relative_drops(values(0.8, 0.2, 1.1), values(0.75, 0.25, 1.0), HIB)
    # acc up 0.05/0.75 (better: -6.67), err down 0.05/0.25 (better: -20), mse up 10% (worse: +10); loss too
    assert drops["a"]["acc"] == pytest.approx(-100 * 0.05 / 0.75)
    assert drops["a"]["err"] == pytest.approx(-20.0) and drops["b"]["mse"] == pytest.approx(10.0)
    assert relative_drops(values(0.8, 0.2, 1.1), values(0.75, 0.25, 1.0), {"a": {"acc": True}}) == \
        {"a": {"acc": pytest.approx(-100 * 0.05 / 0.75)}}  # metrics of unknown direction are left out
    drops = {t: {m: d for m, d in ms.items() if m != "loss"} for t, ms in drops.items()}
    assert delta_m_flat(drops) == pytest.approx((-100 * 0.05 / 0.75 - 20 + 10) / 3)
    assert delta_m_task_averaged(drops) == pytest.approx(((-100 * 0.05 / 0.75 - 20) / 2 + 10) / 2)


def test_groups_have_mean_and_std_over_seeds_and_delta_m_against_the_baseline(sweep):
    text, _ = make_report([sweep], "json", "balancer=fixed", None)
    report = json.loads(text)
    groups = {g["group"]: g for g in report["groups"]}
    assert set(groups) == {"balancer=fixed", "balancer=gradnorm balancer.alpha=0.5"}
    fixed, gradnorm = groups["balancer=fixed"], groups["balancer=gradnorm balancer.alpha=0.5"]
    assert fixed["seeds"] == 2 and gradnorm["seeds"] == 2
    acc = gradnorm["metrics"]["a"]["acc"]
    assert acc["mean"] == pytest.approx(0.80) and acc["std"] == pytest.approx(math.sqrt(2 * 0.02**2))
    assert "loss" not in gradnorm["metrics"]["a"]  # the table and Δm use the task metrics
    assert fixed["delta_m"] == {"flat": 0.0, "task_averaged": 0.0}
    drops = [-100 * (0.80 - 0.75) / 0.75, 100 * (0.20 - 0.25) / 0.25, 100 * (1.1 - 1.0) / 1.0]
    assert gradnorm["delta_m"]["flat"] == pytest.approx(sum(drops) / 3)
    assert gradnorm["delta_m"]["task_averaged"] == pytest.approx(((drops[0] + drops[1]) / 2 + drops[2]) / 2)
    assert gradnorm["baseline_group"] == "balancer=fixed"  # balancer.alpha is dropped with the balancer key
    problems = {Path(p["path"]).name: p["status"] for p in report["problems"]}
    assert problems == {"4": "failed", "5": "incomplete"}
    assert report["model_selection"] == "final step"


def test_markdown_and_csv(sweep):
    markdown, _ = make_report([sweep], "markdown", "balancer=fixed", None)
    assert "| balancer=fixed | 2 | 0.75 ± 0.014 | 0.25 ± 0.014 | 1 ± 0 | +0.00 | +0.00 |" in markdown
    assert "failed:" in markdown and "incomplete:" in markdown and "model selection: final step" in markdown
    table = list(csv.reader(io.StringIO(make_report([sweep], "csv", None, None)[0])))
    assert table[0] == ["group", "seeds", "a/acc ↑", "a/err ↓", "b/mse ↓"]
    assert [row[0] for row in table[1:3]] == ["balancer=fixed", "balancer=gradnorm balancer.alpha=0.5"]


def test_reference_baseline_from_the_task_set_config(tmp_path):
    run = write_run(tmp_path, "r", ["seed=0"], values(0.8, 0.2, 1.1))
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["reference"] = {"a": {"acc": 0.75, "err": 0.25}, "b": {"mse": 1.0}}
    (run / "metrics.json").write_text(json.dumps(metrics))
    report = json.loads(make_report([tmp_path], "json", "reference", None)[0])
    assert report["groups"][0]["delta_m"]["flat"] == pytest.approx((-100 * 0.05 / 0.75 - 20 + 10) / 3)


@pytest.mark.parametrize("args, message", [
    (["--format", "xml"], "--format 'xml': allowed: table, markdown, csv, json"),
    (["--baseline", "fixed"], "--baseline 'fixed': expected key=value"),
    (["--baseline", "balancer=rescaled_norm"], "--baseline balancer=rescaled_norm: no run has a group with"),
    (["--baseline", "reference"], "no run has reference values (tasks.reference)"),
])
def test_bad_options_are_one_line_errors(sweep, args, message):
    result = CliRunner().invoke(app, ["report", str(sweep), *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_missing_or_empty_paths_are_errors(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in result.output
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "no runs under" in result.output


def test_output_file_and_terminal_table(sweep, tmp_path):
    out = tmp_path / "report.md"
    result = CliRunner().invoke(app, ["report", str(sweep), "-f", "markdown", "-o", str(out)])
    assert result.exit_code == 0 and out.read_text().startswith("| group |")
    result = CliRunner().invoke(app, ["report", str(sweep)])
    assert result.exit_code == 0 and "balancer=fixed" in result.output and "0.75 ± 0.014" in result.output


def test_plots_are_written(sweep, tmp_path):
    pytest.importorskip("matplotlib")
    _, written = make_report([sweep], "table", None, tmp_path / "plots")
    assert sorted(p.name for p in written) == ["metrics.png", "tradeoff.png", "weights.png"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_a_real_sweep_end_to_end(tmp_path):
    runner = CliRunner()
    smoke = ["trainer=smoke", "tasks.n_train=512", "tasks.n_val=64", "tasks.n_test=64"]
    result = runner.invoke(app, ["train", "-m", "balancer=fixed,gradnorm", "seed=0,1", f"hydra.sweep.dir={tmp_path}",
                                 *smoke])
    assert result.exit_code == 0, result.output
    report = json.loads(make_report([tmp_path], "json", "balancer=fixed", None)[0])
    groups = {g["group"]: g for g in report["groups"]}
    assert {g: v["seeds"] for g, v in groups.items()} == {"balancer=fixed": 2, "balancer=gradnorm": 2}
    assert groups["balancer=fixed"]["delta_m"]["flat"] == 0.0
    assert not math.isnan(groups["balancer=gradnorm"]["delta_m"]["flat"])
