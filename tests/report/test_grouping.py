"""`mtl-bench report` groups by what was trained: the resolved config minus the seed and the keys
that do not change training; distinct seeds are counted; failed, diverged and incomplete runs are listed apart.

The run directories are written the way a run leaves them: `.hydra/config.yaml` composed from our configs
(as Hydra saves it), `.hydra/overrides.yaml` and `metrics.json`.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import mtl_bench.config  # noqa: F401  (registers schemas)
from mtl_bench.analysis.runs import NOT_TRAINING_KEYS
from mtl_bench.cli import app
from mtl_bench.report.main import make_report
from tests.helpers.run_dirs import saved_run

HIB = {"t0": {"loss": False, "mse": False}, "t1": {"loss": False, "mse": False}}


def test_metrics(t0: float, t1: float) -> dict:
    return {"t0": {"loss": t0, "mse": t0}, "t1": {"loss": t1, "mse": t1}}


test_metrics.__test__ = False  # a helper, not a test


def write_run(
    root: Path, name: str, overrides: list[str], status: str = "completed", t0: float = 0.5, t1: float = 2500.0, **extra
) -> Path:
    """A run directory as `mtl-bench train OVERRIDES` leaves it (without training)."""
    run, cfg, choices = saved_run(root, name, overrides)
    if status == "incomplete":
        return run
    metrics = {
        "status": status,
        "overrides": overrides,
        "choices": choices,
        "seed": cfg.seed,
        "higher_is_better": HIB,
        **extra,
    }
    if status == "completed":
        metrics.update(test=test_metrics(t0, t1), val=test_metrics(t0, t1))
        metrics.setdefault("step", cfg.trainer.max_steps)
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def report(root: Path, baseline: str | None = None) -> dict:
    return json.loads(make_report([root], "json", baseline, None)[0])


def test_equal_configs_are_one_group_and_what_did_not_complete_is_listed_with_its_reason(tmp_path):
    """Defaults, an explicit copy of them and a resumed run are one group; a diverged run and a failed build are
    listed apart with their reasons."""
    write_run(tmp_path, "0_defaults", [], t0=0.50)
    write_run(tmp_path, "1_explicit", ["optim=adam", "balancer=fixed"], t0=0.52)
    write_run(tmp_path, "2_resumed", ["trainer.resume=auto", "trainer.log_every=10"], t0=0.54)
    write_run(
        tmp_path,
        "3_diverged",
        ["optim=sgd", "optim.lr=0.05"],
        status="diverged",
        step=112,
        error="diverged: 11 of the last 100 steps skipped for non-finite gradients (first at step 12, task t1)",
        reason="max_skipped_fraction",
    )
    write_run(
        tmp_path,
        "4_failed",
        ["model._target_=my_lab.Nope"],
        status="failed",
        step=0,
        error="model._target_: cannot import my_lab.Nope",
    )
    out = report(tmp_path, "balancer=fixed")
    assert [(g["group"], g["seeds"], g["n_runs"]) for g in out["groups"]] == [("(defaults)", 1, 3)]
    group = out["groups"][0]
    assert group["metrics"]["t0"]["mse"]["mean"] == pytest.approx(0.52)
    assert group["metrics"]["t0"]["mse"]["std"] is None  # three runs of one seed are not three seeds
    assert group["delta_m"] == {"flat": 0.0, "task_averaged": 0.0}  # the baseline against itself
    problems = {Path(p["path"]).name: p for p in out["problems"]}
    assert {name: p["status"] for name, p in problems.items()} == {"3_diverged": "diverged", "4_failed": "failed"}
    assert "non-finite gradients (first at step 12, task t1)" in problems["3_diverged"]["reason"]
    assert problems["4_failed"]["reason"] == "model._target_: cannot import my_lab.Nope"

    table = CliRunner().invoke(app, ["report", str(tmp_path), "-f", "markdown"])
    assert table.exit_code == 0, table.output
    assert "| (defaults) | 3 runs, 1 seed | 0.52 ± n/a |" in table.output  # no interval over one seed, not "± 0"
    assert "runs of one seed averaged first" in table.output
    lines = table.output.splitlines()
    assert any(
        line.strip().startswith("diverged:") and "3_diverged (optim=sgd optim.lr=0.05): diverged: 11 of" in line
        for line in lines
    )
    assert any(line.strip().startswith("failed:") and line.endswith("cannot import my_lab.Nope") for line in lines)


def test_a_report_with_nothing_completed_says_why_in_one_line(tmp_path):
    write_run(tmp_path, "0", ["optim.lr=-1"], status="failed", error="optim.lr=-1.0 is not allowed: must be >= 0")
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "no completed runs among 1 found: failed:" in result.output
    assert "(optim.lr=-1): optim.lr=-1.0 is not allowed" in result.output


def test_seeds_are_counted_as_distinct_seeds_and_averaged_per_seed_first(tmp_path):
    write_run(tmp_path, "a", ["seed=0"], t0=0.4)
    write_run(tmp_path, "b", ["seed=0", "trainer.resume=auto"], t0=0.6)  # seed 0 again: mean 0.5
    write_run(tmp_path, "c", ["seed=1"], t0=0.7)
    write_run(tmp_path, "d", ["seed=2"], status="incomplete")
    out = report(tmp_path)
    (group,) = out["groups"]
    assert (group["seeds"], group["n_runs"]) == (2, 3)
    mse = group["metrics"]["t0"]["mse"]
    assert mse["mean"] == pytest.approx(0.6) and mse["n"] == 2
    assert mse["std"] == pytest.approx(math.sqrt(2 * 0.1**2))
    assert [(Path(p["path"]).name, p["status"]) for p in out["problems"]] == [("d", "incomplete")]
    assert "killed" in out["problems"][0]["reason"]
    markdown = make_report([tmp_path], "markdown", None, None)[0]
    # the 95% CI, 12.706 · 0.1414 / √2 = 1.27, would reach below zero for an mse that is never negative: n/a
    assert "| (defaults) | 3 runs, 2 seeds | 0.6 ± n/a |" in markdown
    assert mse["ci95"] is None and mse["ci95_below_zero"] is True


def test_time_per_step_is_measured_in_each_run_and_averaged_per_seed_first(tmp_path):
    write_run(tmp_path, "a", ["seed=0"], wall_time_s=10.0)  # 10 ms a step (write_run records 1000 steps)
    # the same seed killed and resumed: wall_time_s covers both sessions, step counts every step once
    write_run(tmp_path, "b", ["seed=0", "trainer.resume=auto"], wall_time_s=14.0)  # 14 ms: seed 0 is 12 ms
    write_run(tmp_path, "c", ["seed=1"], wall_time_s=9.0, step=500)  # 18 ms
    write_run(tmp_path, "d", ["seed=2"])  # recorded no wall_time_s: left out of the time, not of the metrics
    (group,) = report(tmp_path)["groups"]
    assert group["seeds"] == 3
    time = group["time_per_step_ms"]
    assert time["n"] == 2 and time["mean"] == pytest.approx(15.0) and time["std"] == pytest.approx(3 * math.sqrt(2))
    # t_{0.975,1} · s / √2 = 38 ms would put the interval below zero for a time: none is given
    assert time["ci95"] is None and time["ci95_below_zero"] is True
    markdown = make_report([tmp_path], "markdown", None, None)[0]
    assert markdown.splitlines()[2].endswith("| 1.00 | 15 ± n/a |")  # mean rank alone: 1; time/step in ms
    assert "Student t's interval would reach below zero for a quantity that is never negative" in markdown
    write_run(tmp_path / "close", "a", ["seed=0"], wall_time_s=10.0)
    write_run(tmp_path / "close", "b", ["seed=1"], wall_time_s=10.2)
    time = report(tmp_path / "close")["groups"][0]["time_per_step_ms"]
    assert time["ci95"] == pytest.approx(12.706204736174694 * 0.1) and "ci95_below_zero" not in time  # 10.1 ± 1.3
    write_run(tmp_path / "one", "a", ["seed=0"], wall_time_s=2.5)
    assert make_report([tmp_path / "one"], "markdown", None, None)[0].splitlines()[2].endswith("| 2.5 ± n/a |")


def test_labels_name_what_differs_and_the_baseline_matches_resolved_values(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path, f"fixed_{seed}", [f"seed={seed}"], t0=0.5)  # the defaults: balancer=fixed, lr 0.001
        write_run(tmp_path, f"gradnorm_{seed}", ["balancer=gradnorm", "balancer.alpha=0.5", f"seed={seed}"], t0=0.4)
        write_run(tmp_path, f"gradnorm_default_{seed}", ["balancer=gradnorm", f"seed={seed}"], t0=0.45)
        write_run(tmp_path, f"lr_{seed}", ["optim.lr=0.01", f"seed={seed}"], t0=0.6)
    out = report(tmp_path, "balancer=fixed")
    groups = {g["group"]: g for g in out["groups"]}
    # each label names what its group changes from the others' defaults
    assert list(groups) == ["(defaults)", "balancer=gradnorm balancer.alpha=0.5", "balancer=gradnorm", "optim.lr=0.01"]
    assert all(g["seeds"] == 2 and g["n_runs"] == 2 for g in groups.values())
    assert groups["balancer=gradnorm balancer.alpha=0.5"]["baseline_group"] == "(defaults)"
    assert groups["balancer=gradnorm"]["baseline_group"] == "(defaults)"
    assert groups["optim.lr=0.01"]["baseline_group"] == "optim.lr=0.01"  # itself: fixed at lr 0.01
    assert groups["(defaults)"]["delta_m"]["flat"] == 0.0
    out = report(tmp_path, "optim.lr=1e-3")  # typed differently from the recorded 0.001
    groups = {g["group"]: g for g in out["groups"]}
    assert groups["optim.lr=0.01"]["baseline_group"] == "(defaults)"
    assert groups["balancer=gradnorm"]["baseline_group"] == "balancer=gradnorm"
    out = report(tmp_path, "optim=adam")  # the option drops every optim key: no other group differs only there
    assert {g["group"]: g["baseline_group"] for g in out["groups"]}["optim.lr=0.01"] == "(defaults)"


def test_a_config_group_option_alone_does_not_split_what_trained_the_same(tmp_path):
    # trainer=smoke is the default trainer with max_steps 20, batch size 32 and other logging intervals
    write_run(tmp_path, "smoke", ["trainer=smoke"])
    write_run(tmp_path, "spelled_out", ["trainer.max_steps=20", "trainer.batch_size=32", "trainer.eval_every=10"])
    write_run(tmp_path, "longer", ["trainer=smoke", "trainer.max_steps=40", "seed=1"])
    groups = {g["group"]: sorted(Path(r).name for r in g["runs"]) for g in report(tmp_path)["groups"]}
    assert groups == {"trainer.max_steps=20": ["smoke", "spelled_out"], "trainer.max_steps=40": ["longer"]}


def test_a_run_from_before_an_option_existed_groups_with_runs_at_its_default(tmp_path):
    write_run(tmp_path, "new", ["seed=0"])
    older = write_run(tmp_path, "older", ["seed=1"])
    config = yaml.safe_load((older / ".hydra" / "config.yaml").read_text())
    del config["trainer"]["validation_source"]  # written by a version without the option
    (older / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    write_run(tmp_path, "other", ["seed=0", "trainer.validation_source=val"])
    groups = {g["group"]: sorted(Path(r).name for r in g["runs"]) for g in report(tmp_path)["groups"]}
    assert groups == {"(defaults)": ["new", "older"], "trainer.validation_source=val": ["other"]}


def test_runs_without_a_saved_config_fall_back_to_their_overrides(tmp_path):
    for name, overrides in [
        ("a", ["balancer=fixed", "seed=0"]),
        ("b", ["balancer=fixed", "seed=0", "trainer.resume=auto"]),
    ]:
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.json").write_text(
            json.dumps(
                {
                    "status": "completed",
                    "overrides": overrides,
                    "choices": {"balancer": "fixed"},
                    "higher_is_better": HIB,
                    "test": test_metrics(0.5, 2500.0),
                }
            )
        )
    out = report(tmp_path, "balancer=fixed")
    assert [(g["group"], g["seeds"], g["n_runs"]) for g in out["groups"]] == [("balancer=fixed", 1, 2)]


def test_the_keys_left_out_of_a_group_are_one_documented_list():
    assert {
        "seed",
        "tag",
        "hydra",
        "trainer.resume",
        "trainer.log_every",
        "trainer.eval_every",
        "trainer.checkpoint_every",
        "trainer.progress",
        "trainer.device",
        "trainer.num_threads",
        "trainer.num_workers",
        "trainer.profile",
    } <= set(NOT_TRAINING_KEYS)


def test_labels_are_as_typed_and_what_every_row_has_is_stated_once_above_the_table(tmp_path):
    """`-m model/arch=hps,mmoe balancer=fixed,gradnorm trainer.max_steps=50 tag=x`: the option is labelled as typed
    (model/arch=mmoe, not model.arch=mmoe); the length and the tag, the same in every row, are stated once above the
    table in every table form, never in the rows."""
    for i, (arch, balancer) in enumerate(
        [("hps", "fixed"), ("hps", "gradnorm"), ("mmoe", "fixed"), ("mmoe", "gradnorm")]
    ):
        overrides = [f"model/arch={arch}", f"balancer={balancer}", "trainer.max_steps=50", "tag=x"]
        write_run(tmp_path, str(i), overrides, t0=0.5 + 0.01 * i)
    labels = [g["group"] for g in report(tmp_path)["groups"]]
    assert labels == [
        "model/arch=hps balancer=fixed",
        "model/arch=hps balancer=gradnorm",
        "model/arch=mmoe balancer=fixed",
        "model/arch=mmoe balancer=gradnorm",
    ]
    for fmt, wide in (("table", False), ("table", True), ("markdown", False)):
        text = make_report([tmp_path], fmt, None, None, wide=wide)[0]
        assert "model.arch" not in text
        rows = [line for line in text.splitlines() if line.startswith(("│", "| model"))]
        assert len(rows) == 4 * (2 if fmt == "markdown" else 1) and not any(
            "max_steps" in r or "tag" in r for r in rows
        )
        above = [line for line in text.splitlines() if line.startswith("every run has:")]
        assert above == ["every run has: trainer.max_steps=50 tag=x"] * (2 if fmt == "markdown" else 1), text


def test_the_keys_every_row_of_a_table_shares_leave_its_labels(tmp_path):
    """Two task sets, one table each: within each table every row has the same `tasks`, so the labels keep only the
    balancer and the task set is said once above its table."""
    for tasks in ("toy", "toy10"):
        for balancer in ("fixed", "gradnorm"):
            write_run(tmp_path, f"{tasks}_{balancer}", [f"tasks={tasks}", f"balancer={balancer}"])
    text = make_report([tmp_path], "table", None, None)[0]
    rows = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
    assert rows and all(label.startswith("balancer=") for label in rows), text
    assert "every run has: tasks=toy10" in text


def test_a_groups_tags_are_shown_in_the_report(tmp_path):
    """tag is no training key: runs that differ only in it are one group, which lists every tag it saw; tags that
    differ between groups get a column, in every form."""
    write_run(tmp_path, "a", ["balancer=fixed", "tag=first"])
    write_run(tmp_path, "b", ["balancer=fixed", "seed=1", "+tag.lab=ours"])
    write_run(tmp_path, "c", ["balancer=gradnorm", "tag=second"])
    groups = {g["group"]: g["tags"] for g in report(tmp_path)["groups"]}
    assert groups == {"balancer=fixed": ["tag.lab=ours", "tag=first"], "balancer=gradnorm": ["tag=second"]}
    text = " ".join(make_report([tmp_path], "table", None, None)[0].split())
    assert "┃ group ┃ tag ┃ seeds ┃" in text and "│ balancer=gradnorm │ tag=second │ 1 │" in text
    rows = list(csv.reader(io.StringIO(make_report([tmp_path], "csv", None, None)[0])))
    assert {row[0]: dict(zip(rows[0], row))["tag"] for row in rows[1:]}["balancer=fixed"] == "tag.lab=ours, tag=first"
