"""`mtl-bench report`: groups over seeds, Δm in both conventions, mean rank, 95% intervals, time per step, formats,
failed runs, plots."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtl_bench.analysis.delta_m import delta_m_flat, delta_m_task_averaged, relative_drops
from mtl_bench.cli import app
from mtl_bench.report.main import make_report

HIB = {"a": {"loss": False, "acc": True, "err": False}, "b": {"loss": False, "mse": False}}


def write_run(
    root: Path,
    name: str,
    overrides: list[str],
    test: dict,
    status: str = "completed",
    choices: dict | None = None,
    wall_time_s: float | None = None,
    step: int = 1000,
) -> Path:
    run = root / name
    run.mkdir(parents=True)
    metrics = {
        "status": status,
        "overrides": overrides,
        "choices": choices or {"balancer": "fixed", "tasks": "toy"},
        "higher_is_better": HIB,
    }
    if status == "completed":
        metrics["test"] = test
        if wall_time_s is not None:
            metrics.update(wall_time_s=wall_time_s, step=step)
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
    write_run(root, "0", ["balancer=fixed", "seed=0"], values(0.74, 0.26, 1.0), choices=fixed, wall_time_s=2.0)
    write_run(root, "1", ["balancer=fixed", "seed=1"], values(0.76, 0.24, 1.0), choices=fixed, wall_time_s=2.2)
    write_run(
        root,
        "2",
        ["balancer=gradnorm", "balancer.alpha=0.5", "seed=0"],
        values(0.78, 0.21, 1.2),
        choices=gradnorm,
        wall_time_s=5.0,
    )
    write_run(
        root,
        "3",
        ["balancer=gradnorm", "balancer.alpha=0.5", "seed=1"],
        values(0.82, 0.19, 1.0),
        choices=gradnorm,
        wall_time_s=5.4,
    )
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
    assert relative_drops(values(0.8, 0.2, 1.1), values(0.75, 0.25, 1.0), {"a": {"acc": True}}) == {
        "a": {"acc": pytest.approx(-100 * 0.05 / 0.75)}
    }  # metrics of unknown direction are left out
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
    assert (
        "| group | seeds | a/acc ↑ | a/err ↓ | b/mse ↓ | Δm flat % ↓ | Δm task-avg % ↓ | mean rank ↓ | "
        "time/step ms |" in markdown
    )
    # ± the 95% CI: t_{0.975,1} = 12.706 times s/√2 (s = 0.014 for acc; 1.778·√2 for the per-seed Δm of the baseline)
    assert (
        "| balancer=fixed | 2 | 0.75 ± 0.13 | 0.25 ± 0.13 | 1 ± 0 | baseline | baseline | 1.67 | "
        "2.1 ± 1.3 |" in markdown
    )
    assert (
        "| balancer=gradnorm balancer.alpha=0.5 | 2 | 0.8 ± 0.25 | 0.2 ± 0.13 | 1.1 ± n/a | -5.56 ± 70.59 | "
        "-1.67 ± 84.71 | 1.33 | 5.2 ± 2.5 |" in markdown
    )
    assert "failed:" in markdown and "incomplete:" in markdown and "model selection: final step" in markdown
    assert "95% confidence interval" in markdown and "mean rank:" in markdown and "wall_time_s / step" in markdown
    table = list(csv.reader(io.StringIO(make_report([sweep], "csv", None, None)[0])))
    assert table[0] == [
        "group",
        "seeds",
        "a/acc ↑",
        "a/acc std",
        "a/acc ci95",
        "a/err ↓",
        "a/err std",
        "a/err ci95",
        "b/mse ↓",
        "b/mse std",
        "b/mse ci95",
        "mean rank ↓",
        "time/step ms",
        "time/step ms ci95",
        "tag",
    ]
    assert [row[0] for row in table[1:3]] == ["balancer=fixed", "balancer=gradnorm balancer.alpha=0.5"]
    fixed = dict(zip(table[0], table[1]))
    assert float(fixed["a/acc ↑"]) == pytest.approx(0.75) and float(fixed["a/acc std"]) == pytest.approx(0.02 / 2**0.5)
    assert float(fixed["a/acc ci95"]) == pytest.approx(12.706204736 * 0.01)  # t · (0.02/√2) / √2
    assert float(fixed["mean rank ↓"]) == pytest.approx(5 / 3)
    assert float(fixed["time/step ms"]) == pytest.approx(2.1)
    assert float(fixed["time/step ms ci95"]) == pytest.approx(12.706204736 * 0.1)
    with_dm = list(csv.reader(io.StringIO(make_report([sweep], "csv", "balancer=fixed", None)[0])))
    assert with_dm[0][-8:] == [
        "Δm flat % ↓",
        "Δm flat ci95",
        "Δm task-avg % ↓",
        "Δm task-avg ci95",
        "mean rank ↓",
        "time/step ms",
        "time/step ms ci95",
        "tag",
    ]


def test_json_carries_intervals_mean_rank_and_time_per_step(sweep):
    groups = {g["group"]: g for g in json.loads(make_report([sweep], "json", "balancer=fixed", None)[0])["groups"]}
    fixed, gradnorm = groups["balancer=fixed"], groups["balancer=gradnorm balancer.alpha=0.5"]
    t1 = 12.706204736174694  # t_{0.975} with 1 degree of freedom: two seeds
    acc = gradnorm["metrics"]["a"]["acc"]
    assert acc["ci95"] == pytest.approx(t1 * acc["std"] / math.sqrt(2)) and acc["n"] == 2
    # Δm per seed against the baseline's means: seed 0 (1.333 + 4 + 0)/3, seed 1 the opposite
    assert fixed["delta_m_ci95"]["flat"] == pytest.approx(t1 * (16 / 9) * math.sqrt(2) / math.sqrt(2))
    assert (fixed["mean_rank"], gradnorm["mean_rank"]) == (pytest.approx(5 / 3), pytest.approx(4 / 3))
    assert fixed["time_per_step_ms"] == {
        "mean": pytest.approx(2.1),
        "std": pytest.approx(0.2 / math.sqrt(2)),
        "ci95": pytest.approx(t1 * 0.1),
        "n": 2,
    }
    assert gradnorm["time_per_step_ms"]["mean"] == pytest.approx(5.2)


def test_every_group_is_ranked_within_its_task_set(tmp_path):
    for i, (acc, err, mse) in enumerate([(0.7, 0.3, 1.0), (0.8, 0.3, 2.0), (0.9, 0.1, 3.0)]):
        write_run(
            tmp_path,
            f"toy_{i}",
            [f"balancer.x={i}"],
            values(acc, err, mse),
            choices={"balancer": "fixed", "tasks": "toy"},
        )
    write_run(
        tmp_path, "other", ["tasks=other"], values(0.1, 0.9, 9.0), choices={"balancer": "fixed", "tasks": "other"}
    )
    groups = {g["group"]: g["mean_rank"] for g in json.loads(make_report([tmp_path], "json", None, None)[0])["groups"]}
    # toy: acc ranks 3, 2, 1; err (0.3, 0.3, 0.1) 2.5, 2.5, 1; mse 1, 2, 3; the other task set alone: rank 1
    assert groups == {
        "balancer.x=0": pytest.approx(6.5 / 3),
        "balancer.x=1": pytest.approx(6.5 / 3),
        "balancer.x=2": pytest.approx(5 / 3),
        "tasks=other": 1.0,
    }


def test_reference_baseline_from_the_task_set_config(tmp_path):
    run = write_run(tmp_path, "r", ["seed=0"], values(0.8, 0.2, 1.1))
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["reference"] = {"a": {"acc": 0.75, "err": 0.25}, "b": {"mse": 1.0}}
    (run / "metrics.json").write_text(json.dumps(metrics))
    report = json.loads(make_report([tmp_path], "json", "reference", None)[0])
    assert report["groups"][0]["delta_m"]["flat"] == pytest.approx((-100 * 0.05 / 0.75 - 20 + 10) / 3)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "xml"], "--format 'xml': allowed: table, markdown, csv, json"),
        (["--baseline", "fixed"], "--baseline 'fixed': expected key=value"),
        (["--baseline", "balancer=rescaled_norm"], "--baseline balancer=rescaled_norm: no run has a group with"),
        (["--baseline", "reference"], "no run has reference values (tasks.reference)"),
    ],
)
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
    result = CliRunner().invoke(app, ["report", str(sweep), "--wide"])
    assert result.exit_code == 0 and "balancer=fixed" in result.output and "0.75 ± 0.13" in result.output


def write_weights(run: Path, weights: dict[str, float], steps: int = 200) -> None:
    """TensorBoard weight/<task> scalars as a run writes them."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run))
    for step in range(10, steps + 1, 10):
        for task, weight in weights.items():
            writer.add_scalar(f"weight/{task}", weight, step)
    writer.close()


def test_plots_are_written(sweep, tmp_path):
    pytest.importorskip("matplotlib")
    write_weights(sweep / "0", {"a": 1.0, "b": 1.0})  # equal weights: two lines on top of each other
    write_weights(sweep / "2", {"a": 850.0, "b": 8.0})  # two orders of magnitude apart: a log axis
    _, written = make_report([sweep], "table", "balancer=fixed", tmp_path / "plots")
    assert sorted(p.name for p in written) == ["delta_m_vs_time.png", "metrics.png", "tradeoff.png", "weights.png"]
    assert all(p.stat().st_size > 1000 for p in written)
    _, written = make_report([sweep], "table", None, tmp_path / "no_baseline")  # the mean rank instead of Δm
    assert sorted(p.name for p in written) == ["metrics.png", "rank_vs_time.png", "tradeoff.png", "weights.png"]


def test_plot_axes_follow_the_values():
    pytest.importorskip("matplotlib")
    from mtl_bench.report.plots import pareto_front, spans_orders

    assert spans_orders([8.0, 850.0]) and spans_orders([0.01, 0.5])
    assert not spans_orders([0.74, 0.82]) and not spans_orders([0.0, 850.0]) and not spans_orders([])
    # a: lower is better, b: higher is better; (2, 5) is dominated by (1, 5) and (2, 4) by every point but itself
    assert pareto_front([(1.0, 5.0), (2.0, 5.0), (0.5, 1.0), (2.0, 4.0)], (False, True)) == [0, 2]


def test_a_real_sweep_end_to_end(tmp_path):
    runner = CliRunner()
    # 400 steps: in the smoke length (20) the toy's losses do not move, and the report lists the runs as not learned
    smoke = ["trainer=smoke", "trainer.max_steps=400", "trainer.log_every=40", "tasks.n_train=512", "tasks.n_val=64"]
    result = runner.invoke(
        app, ["train", "-m", "balancer=fixed,gradnorm", "seed=0,1", f"hydra.sweep.dir={tmp_path}", *smoke]
    )
    assert result.exit_code == 0, result.output
    printed = " ".join(result.output.split())  # the end-of-sweep summary (report/sweep_callback.py)
    assert f"sweep finished: {tmp_path}" in printed and "│ balancer=gradnorm │ 2 │" in printed
    assert "best by mean rank: balancer=" in printed or "tie on mean rank" in printed  # the winner line
    report = json.loads(make_report([tmp_path], "json", "balancer=fixed", None)[0])
    groups = {g["group"]: g for g in report["groups"]}
    assert {g: v["seeds"] for g, v in groups.items()} == {"balancer=fixed": 2, "balancer=gradnorm": 2}
    assert groups["balancer=fixed"]["delta_m"]["flat"] == 0.0
    assert not math.isnan(groups["balancer=gradnorm"]["delta_m"]["flat"])


def test_single_task_runs_are_listed_apart_never_ranked_first(sweep):
    """A run on one task (trainer.only_tasks) has one task's metrics: ranked with the groups it would come first."""
    for seed in (0, 1):
        write_run(
            sweep,
            f"st{seed}",
            ["balancer=fixed", "trainer.only_tasks=[a]", f"seed={seed}"],
            {"a": {"loss": 0.5, "acc": 0.99, "err": 0.01}},
        )
    text, _ = make_report([sweep], "table", None, None)
    table, _, references = text.partition("single-task references")
    assert "only_tasks" not in table and "best by mean rank: balancer=gradnorm" in table
    assert "trainer.only_tasks=[a] (2 seeds): a/acc 0.99" in references
    as_json = json.loads(make_report([sweep], "json", None, None)[0])
    assert all("only_tasks" not in json.dumps(group) for group in as_json["groups"])
