"""Published rows (report/published/*.yaml): checks of the transcription, and `report --published`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mtl_bench.cli import app
from mtl_bench.report.main import make_report
from mtl_bench.report.published import available, load

CONF = Path(__file__).resolve().parents[2] / "conf" / "tasks"


def decimals(x: float) -> int:
    text = repr(float(x))
    return len(text.split(".")[1].rstrip("0")) if "." in text else 0


@pytest.mark.parametrize("name", ["nash_mtl", "famo"])
def test_mean_ranks_sum_to_what_n_methods_ranks_sum_to_or_the_table_says_why_not(name):
    """Mean ranks of n methods over the same metrics sum to 1 + ... + n (ties included). Up to the rounding of the
    printed values, a table either satisfies that or carries an `mr_note` saying it does not: a typo in the
    transcription breaks it."""
    for tasks, table in load(name).items():
        mrs = [r.mr for r in table.rows]
        n = len(mrs)
        rounding = n * 0.5 * 10.0 ** -min(decimals(x) for x in mrs) + 1e-9
        consistent = abs(sum(mrs) - n * (n + 1) / 2) <= rounding
        noted = any("sum to" in note for note in table.notes)
        assert consistent != noted, (name, tasks, sum(mrs), n)


def test_famo_copies_the_baselines_delta_m_from_nash_mtl_except_the_noted_misprint():
    nash, famo = load("nash_mtl"), load("famo")
    for tasks in ("qm9", "nyuv2", "cityscapes"):
        theirs = {r.method: r for r in nash[tasks].rows}
        for row in famo[tasks].rows:
            if row.method == "FAMO":
                continue
            if row.note:
                assert row.delta_m != theirs[row.method].delta_m and "misprint" in row.note
            else:
                assert row.delta_m == theirs[row.method].delta_m, (tasks, row.method)


def test_single_task_rows_match_the_task_sets_reference_values():
    """The papers' STL rows and conf/tasks/*.yaml's reference were transcribed separately: they must agree."""
    for tasks in ("nyuv2", "cityscapes"):
        reference = yaml.safe_load((CONF / f"{tasks}.yaml").read_text())["reference"]
        for name in available():
            assert load(name)[tasks].stl == reference, (name, tasks)


def test_celeba_keeps_the_printed_numbers_and_says_the_columns_look_swapped():
    (note,) = load("famo")["celeba"].notes
    assert "swapped" in note
    mgda = next(r for r in load("famo")["celeba"].rows if r.method == "MGDA")
    assert (mgda.delta_m, mgda.mr) == (14.85, 10.93)


HIB = {
    "segmentation": {"loss": False, "miou": True, "pixel_acc": True},
    "depth": {"loss": False, "abs_err": False, "rel_err": False},
}


def write_run(root: Path, name: str, balancer: str, seed: int, miou: float) -> None:
    run = root / name
    run.mkdir(parents=True)
    test = {
        "segmentation": {"loss": 1.0, "miou": miou, "pixel_acc": 0.9316},
        "depth": {"loss": 1.0, "abs_err": 0.0125, "rel_err": 27.77},
    }
    metrics = {
        "status": "completed",
        "overrides": [f"balancer={balancer}", f"seed={seed}"],
        "choices": {"balancer": balancer, "tasks": "cityscapes"},
        "seed": seed,
        "higher_is_better": HIB,
        "test": test,
    }
    (run / "metrics.json").write_text(json.dumps(metrics))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for seed in (0, 1):
        write_run(tmp_path, f"fixed_{seed}", "fixed", seed, 0.7401 * (0.9 + 0.02 * seed))
        write_run(tmp_path, f"uw_{seed}", "uw", seed, 0.7401 * (0.96 + 0.02 * seed))
    return tmp_path


def test_published_rows_beside_the_users_groups_with_delta_m_against_the_papers_single_task_row(sweep):
    report = json.loads(make_report([sweep], "json", None, None, published="nash_mtl")[0])
    groups = {g["group"]: g for g in report["groups"]}
    # only miou differs from the STL row: -91% and -89% of it, relative drops 9% and 11%, over 4 metrics
    assert groups["balancer=fixed"]["delta_m"]["flat"] == pytest.approx(100 * 0.09 / 4)
    assert groups["balancer=uw"]["delta_m"]["flat"] == pytest.approx(100 * 0.03 / 4)
    assert report["published"]["cityscapes"]["table"].startswith("Table 3")
    text = " ".join(make_report([sweep], "table", None, None, published="nash_mtl")[0].split())
    assert "Nash-MTL (nash_mtl) [published] │ 3 │ +6.82 │ 1.75" in text
    assert "LS (nash_mtl) [published] │ 3 │ +22.60 │ 6.12" in text  # as printed
    assert "balancer=uw │ 2 │ +0.75 ±" in text and "Navon et al." in text and "as printed" in text
    famo = " ".join(make_report([sweep], "table", None, None, published="famo")[0].split())
    assert "LS (famo) [published] │ 3 │ +14.11 │ 6.50" in famo and "misprint kept" in famo


@pytest.mark.parametrize(
    "args, message",
    [
        (["--published", "nope"], "--published 'nope': allowed: famo, nash_mtl"),
        (["--published", "famo", "-b", "balancer=fixed"], "leave out --baseline"),
    ],
)
def test_bad_published_options_are_one_line_errors(sweep, args, message):
    result = CliRunner().invoke(app, ["report", str(sweep), *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
