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


# Each row's printed Δm and MR recomputed from its printed metrics (the tables' `metrics`). A printed value is off
# from the paper's own by less than one unit of its last digit: the papers round some values and truncate others
# (Nash-MTL Table 6 prints the single-task row 60.576, 0.5027, 4.539, 63.852 as 60.57, 0.502, 4.53, 63.8).


def ulp(text: str) -> float:
    return 10.0 ** -len(text.split(".")[1]) if "." in text else 1.0


def printed_ulp(values: list[float]) -> float:
    """A table prints a column with one number of decimals: the finest among its values (8.00 reads as 8.0)."""
    return 10.0 ** -max(decimals(v) for v in values)


def tables_with_metrics():
    return [
        pytest.param(name, tasks, t, id=f"{name}-{tasks}")
        for name in available()
        for tasks, t in load(name).items()
        if t.has_metrics
    ]


def test_every_table_with_a_single_task_row_has_its_per_metric_values_except_celeba():
    found = {(p.values[0], p.values[1]) for p in tables_with_metrics()}
    assert found == {(n, t) for n in ("nash_mtl", "famo") for t in ("qm9", "nyuv2", "cityscapes")}


@pytest.mark.parametrize("name, tasks, table", tables_with_metrics())
def test_each_printed_delta_m_follows_from_the_printed_metrics_or_is_listed_as_inconsistent(name, tasks, table):
    from mtl_bench.report.delta_m import delta_m_flat, relative_drops

    half = 0.5 * printed_ulp([r.delta_m for r in table.rows])
    off = {}
    for row in table.rows:
        drops = relative_drops(table.metrics(row), table.stl, table.higher_is_better)
        k = len(table.columns)
        rounding = sum(
            100 / k * ulp(text) * c.factor / table.stl[c.task][c.metric] for c, text in zip(table.columns, row.printed)
        )
        recomputed = delta_m_flat(drops)
        assert len([d for ds in drops.values() for d in ds.values()]) == k
        if abs(recomputed - row.delta_m) > rounding + half:
            off[row.method] = round(recomputed, 2)
    assert set(off) == set(table.delta_m_inconsistent), off
    for method, value in off.items():  # each one explained, with the value its metrics give
        assert any(method in note and f"{value:.2f}" in note for note in table.notes), (method, value)


@pytest.mark.parametrize("name, tasks, table", tables_with_metrics())
def test_each_printed_mr_follows_from_the_printed_metrics_or_is_listed_as_inconsistent(name, tasks, table):
    """Mean rank over the columns among the paper's methods. A tie between printed values may be none between the
    paper's unrounded ones: each tie of t rows moves a row's rank by up to (t - 1)/2 on that metric."""
    from mtl_bench.report.stats import mean_ranks

    values = [table.metrics(r) for r in table.rows]
    ranks = mean_ranks(values, table.higher_is_better)
    step = printed_ulp([r.mr for r in table.rows])
    k = len(table.columns)
    off = set()
    for i, (row, rank) in enumerate(zip(table.rows, ranks)):
        ties = sum(sum(float(other.printed[j]) == float(row.printed[j]) for other in table.rows) - 1 for j in range(k))
        if abs(rank - 1 + table.mr_base - row.mr) > step + ties / 2 / k + 1e-9:
            off.add(row.method)
    assert off == set(table.mr_inconsistent)
    assert all(any(method in note for note in table.notes) for method in off)


@pytest.mark.parametrize("name, tasks, table", tables_with_metrics())
def test_the_papers_arrows_agree_with_our_task_sets(name, tasks, table):
    from mtl_bench.tasks.dense.tasks import depth_task, normal_task, segmentation_task

    ours = {"segmentation": segmentation_task(7), "depth": depth_task(None), "normal": normal_task(None)}
    for c in table.columns:
        expected = False if tasks == "qm9" else ours[c.task].higher_is_better[c.metric]  # QM9: MAE, lower is better
        assert c.higher_is_better == expected, (name, tasks, c)
        assert c.metric in table.stl[c.task]
