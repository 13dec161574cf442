"""The default report: a table within 100 columns, the winner line, runs that did not learn listed apart, the
baseline and reference rows marked, published rows beside the user's groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtl_bench.analysis.learning import MARGIN
from mtl_bench.cli import app
from mtl_bench.report.compact import WIDTH
from mtl_bench.report.main import make_report

HIB = {"a": {"loss": False, "acc": True}, "b": {"loss": False, "mse": False}}
LONG = "model.hidden=[100,100,100,100] optim.weight_decay=0.0001 trainer.batch_size=64 tasks.noise=0.1"


def write_run(root: Path, name: str, balancer: str, seed: int, acc: float, mse: float, losses: list[float]) -> Path:
    """A completed run whose training loss went through `losses` (TensorBoard loss/<task>, both tasks alike)."""
    from torch.utils.tensorboard import SummaryWriter

    run = root / name
    run.mkdir(parents=True)
    overrides = [f"balancer={balancer}", f"seed={seed}", *LONG.split()]
    metrics = {
        "status": "completed",
        "overrides": overrides,
        "choices": {"balancer": balancer, "tasks": "toy"},
        "seed": seed,
        "higher_is_better": HIB,
        "test": {"a": {"loss": losses[-1], "acc": acc}, "b": {"loss": mse, "mse": mse}},
        "reference": {"a": {"acc": 0.75}, "b": {"mse": 1.0}},
        "wall_time_s": 2.0,
        "step": 1000,
    }
    (run / "metrics.json").write_text(json.dumps(metrics))
    writer = SummaryWriter(str(run))
    for i, loss in enumerate(losses):
        for task in ("a", "b"):
            writer.add_scalar(f"loss/{task}", loss, 10 * (i + 1))
    writer.close()
    return run


LEARNS = [2.0, 1.0, 0.5]


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Three balancers x 3 seeds: `best` clearly best, `fixed` the baseline, `close` near it; `stuck` (an SGD-like
    run whose loss never moved) has the best metrics of all but did not learn."""
    root = tmp_path / "multirun"
    for seed in range(3):
        write_run(root, f"fixed_{seed}", "fixed", seed, 0.75 + 0.01 * seed, 1.0, LEARNS)
        write_run(root, f"close_{seed}", "close", seed, 0.755 + 0.01 * seed, 0.99 + 0.02 * seed, LEARNS)
        write_run(root, f"best_{seed}", "best", seed, 0.90 + 0.005 * seed, 0.5, LEARNS)
        write_run(root, f"stuck_{seed}", "stuck", seed, 0.99, 0.01, [2.0, 1.99, 1.98])
    return root


def test_default_table_fits_100_columns_names_the_winner_and_lists_the_stuck_runs_apart(sweep):
    text, _ = make_report([sweep], "table", "balancer=fixed", None)
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    lines = text.splitlines()
    winner = next(i for i, line in enumerate(lines) if line.startswith("best: "))
    verdict = " ".join(" ".join(lines[winner : winner + 3]).split())
    assert "balancer=best (Δm -34.54)" in verdict and "runner-up: balancer=fixed (the baseline)" in verdict
    assert "separated by more than their 95% CIs" in verdict
    table = "\n".join(lines[:winner])
    assert "stuck" not in table  # never ranked, though its metrics are the best
    listed = text[text.index("not in the table") :]
    assert listed.count("did not learn:") == 3 and "no task's training loss fell by 5% (best 1.0%)" in listed
    assert (
        "balancer=fixed [baseline]" in table and "+0.00" not in table
    )  # the baseline is marked, not compared with itself
    # keys equal in every group are not in the labels: stated once, above the table
    assert not [line for line in lines[:winner] if "│" in line and "weight_decay" in line]
    above = " ".join(table[: table.index("┏")].split())
    assert above.startswith("every run has: ") and sorted(above.split()[3:]) == sorted(LONG.split())
    rows = [line for line in lines[:winner] if "balancer=" in line]
    assert [r.split("│")[1].split()[0] for r in rows] == ["balancer=best", "balancer=fixed", "balancer=close"]


def test_overlapping_intervals_are_called_not_separated(sweep, tmp_path):
    for name in ("best_0", "best_1", "best_2", "stuck_0", "stuck_1", "stuck_2"):
        for f in (sweep / name).iterdir():
            f.unlink()
        (sweep / name).rmdir()
    text, _ = make_report([sweep], "table", "balancer=fixed", None)
    assert "NOT separated: their 95% CIs overlap" in " ".join(text.split())


def test_the_margin_is_what_the_docs_say(tmp_path):
    """A loss that fell just under 5% did not learn; just over 5% did; one task learning is enough."""
    assert MARGIN == 0.05
    write_run(tmp_path, "under", "x", 0, 0.8, 1.0, [1.0, 0.99, 0.951])
    write_run(tmp_path, "over", "y", 0, 0.8, 1.0, [1.0, 0.99, 0.949])
    one = write_run(tmp_path, "one", "z", 0, 0.8, 1.0, [1.0, 0.99, 0.949])
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(one))  # task b got worse (a later event file adds to the series): a still learned
    for step, loss in ((40, 1.5), (50, 3.0)):
        writer.add_scalar("loss/b", loss, step)
    writer.close()
    report = json.loads(make_report([tmp_path], "json", None, None)[0])
    assert len(report["groups"]) == 2
    assert [Path(p["path"]).name for p in report["problems"] if p["status"] == "did not learn"] == ["under"]


def test_metrics_json_decides_when_there_are_no_events(tmp_path):
    run = write_run(tmp_path, "r", "x", 0, 0.8, 1.0, [1.0])
    for events in run.glob("events.out.tfevents.*"):
        events.unlink()
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["initial_test"] = {"a": {"loss": 1.0}, "b": {"loss": 1.0}}
    metrics["test"]["a"]["loss"], metrics["test"]["b"]["loss"] = 1.0, 0.98
    (run / "metrics.json").write_text(json.dumps(metrics))
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0 and "no group to rank: no completed run learned" in result.output
    assert "no task's test loss (untrained -> final) fell by 5% (best 2.0%)" in result.output


def test_reference_row_is_shown_and_marked(sweep):
    text, _ = make_report([sweep], "table", "reference", None)
    row = next(line for line in text.splitlines() if "reference (tasks.reference, single-task)" in line)
    assert "baseline" in row
    wide, _ = make_report([sweep], "markdown", "reference", None)
    assert "| reference (tasks.reference) [baseline] |  | 0.75 | 1 |" in wide


def test_wide_is_behind_a_flag_and_in_markdown(sweep):
    runner = CliRunner()
    default = runner.invoke(app, ["report", str(sweep), "-b", "balancer=fixed"]).output
    wide = runner.invoke(app, ["report", str(sweep), "-b", "balancer=fixed", "--wide"]).output
    assert "a/acc" not in default and "a/acc" in wide
    markdown = runner.invoke(app, ["report", str(sweep), "-b", "balancer=fixed", "-f", "markdown"]).output
    assert "| group | seeds | Δm % ↓ (± 95% CI) |" in markdown and "| group | seeds | a/acc ↑ |" in markdown


def test_no_baseline_ranks_by_mean_rank_and_says_it_has_no_interval(sweep):
    text, _ = make_report([sweep], "table", None, None)
    flat = " ".join(text.split())
    assert "best by mean rank: balancer=best (1.00;" in flat and "mean rank has no interval" in flat


def test_the_tie_line_names_every_tied_group(tmp_path):
    """Three groups with equal metrics all share mean rank 2.00: the line names the three, not the first two."""
    for balancer in ("fixed", "rescaled_norm", "gradnorm"):
        write_run(tmp_path, balancer, balancer, 0, 0.8, 1.0, LEARNS)
    flat = " ".join(make_report([tmp_path], "table", None, None)[0].split())
    tied = flat.split("no single best group: ")[1].split(" all tie on mean rank (2.00)")[0]
    assert sorted(tied.replace(" and ", ", ").split(", ")) == [
        "balancer=fixed",
        "balancer=gradnorm",
        "balancer=rescaled_norm",
    ]
    write_run(tmp_path, "worse", "worse", 0, 0.7, 2.0, LEARNS)  # three of four tie for best
    flat = " ".join(make_report([tmp_path], "table", None, None)[0].split())
    tied = flat.split("no single best group: ")[1].split(" tie on mean rank (2.00)")[0]
    assert tied.count("balancer=") == 3 and "worse" not in tied and "all" not in tied
