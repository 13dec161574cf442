"""Published rows (report/published/*.yaml): checks of the transcription, and `report --published`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mtl_bench.cli import app
from mtl_bench.report.compact import WIDTH
from mtl_bench.report.main import make_report
from mtl_bench.report.published import Column, PublishedRow, PublishedTable, available, joint_ranks, load

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
    recomputed = report["published"]["cityscapes"]["mean_rank_recomputed"]
    uw, ls = recomputed["published"]["UW"], recomputed["published"]["LS"]
    assert f"UW [published] │ 3 │ +5.89 │ {uw:.2f} │ 5.25 │" in text  # Δm and MR as printed
    assert f"LS [published] │ 3 │ +22.60 │ {ls:.2f} │ 6.12 │" in text
    assert f"balancer=uw │ 2 │ +0.75 ± 3.18 │ {recomputed['groups']['balancer=uw']:.2f} │ │" in text
    assert "MR ↓ recomputed ┃ MR printed" in text and "Navon et al." in text and "among your groups and its 11" in text
    famo = " ".join(make_report([sweep], "table", None, None, published="famo")[0].split())
    assert "LS [published] │ 3 │ +14.11 │" in famo and "│ 6.50 │" in famo and "misprint kept" in famo


def test_recomputed_mean_ranks_rank_the_groups_and_the_papers_rows_together_on_every_paper_metric(sweep):
    """13 entries (2 groups, 11 rows), each ranked on the same 4 metrics: their mean ranks sum to 1 + ... + 13
    (ties included). Among themselves the two groups rank 1 and 2 on miou and tie on the other 3 metrics."""
    report = json.loads(make_report([sweep], "json", None, None, published="nash_mtl")[0])
    recomputed = report["published"]["cityscapes"]["mean_rank_recomputed"]
    ranks = [*recomputed["groups"].values(), *recomputed["published"].values()]
    assert len(ranks) == 13 and sum(ranks) == pytest.approx(13 * 14 / 2)
    groups = {g["group"]: g["mean_rank"] for g in report["groups"]}
    assert groups == {
        "balancer=uw": pytest.approx((1 + 1.5 * 3) / 4),
        "balancer=fixed": pytest.approx((2 + 1.5 * 3) / 4),
    }


def test_joint_ranks_on_a_hand_checked_table():
    """Two printed rows, P and Q, on metric a (printed %, higher is better) and b (lower is better), and a group G:
    on a: P 0.50, G 0.45, Q 0.40 -> 1, 2, 3; on b: Q 1, P 2, G 3 -> 1, 2, 3. G's `loss` is not a paper column."""
    table = PublishedTable(
        "x",
        "paper",
        "Table 1",
        {"t": {"a": 0.5, "b": 1.0}},
        [PublishedRow("P", 1.5, 0.0, printed=["50", "2.0"]), PublishedRow("Q", 1.5, 0.0, printed=["40", "1.0"])],
        columns=[Column("t", "a", True, 0.01), Column("t", "b", False, 1.0)],
    )
    mine, theirs = joint_ranks(table, [{"t": {"a": 0.45, "b": 3.0, "loss": 0.0}}, {"t": {"a": 0.6}}])
    assert mine == [pytest.approx((3 + 3) / 2), 1.0] and theirs == [pytest.approx((2 + 2) / 2), (4 + 1) / 2]


def test_the_default_table_with_recomputed_ranks_fits_100_columns(tmp_path: Path):
    for seed in (0, 1):
        write_run(tmp_path, f"long_{seed}", "gradnorm_" + "x" * 60, seed, 0.70)
        write_run(tmp_path, f"fixed_{seed}", "fixed", seed, 0.72)
    text = make_report([tmp_path], "table", None, None, published="famo")[0]
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    assert "MR printed" in text


def test_without_per_metric_values_the_published_mr_is_shown_as_printed_and_said_so(tmp_path: Path):
    for balancer in ("fixed", "uw"):
        run = tmp_path / balancer
        run.mkdir()
        metrics = {
            "status": "completed",
            "overrides": [f"balancer={balancer}"],
            "choices": {"balancer": balancer, "tasks": "celeba"},
            "seed": 0,
            "higher_is_better": {"smiling": {"f1": True}},
            "test": {"smiling": {"f1": 0.9 if balancer == "uw" else 0.8}},
        }
        (run / "metrics.json").write_text(json.dumps(metrics))
    text = " ".join(make_report([tmp_path], "table", None, None, published="famo")[0].split())
    assert "MGDA [published] │ 3 │ 10.93 │" in text and "MR printed" not in text
    assert "not recomputed with yours, the per-metric values are not transcribed" in text


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
    from mtl_bench.analysis.delta_m import delta_m_flat, relative_drops

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
    from mtl_bench.analysis.stats import mean_ranks

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


def test_a_qm9_group_with_nash_mtls_own_maes_ties_its_row_on_every_target(tmp_path: Path):
    """The 11 targets by our task names (mae in the paper's units): a group whose MAEs are Nash-MTL's printed ones
    shares that row's rank on every metric, so both get the same recomputed mean rank."""
    table = load("nash_mtl")["qm9"]
    nash = table.metrics(next(r for r in table.rows if r.method == "Nash-MTL"))
    for seed in (0, 1):
        run = tmp_path / f"copy_{seed}"
        run.mkdir()
        metrics = {
            "status": "completed",
            "overrides": ["balancer=nash_mtl", f"seed={seed}"],
            "choices": {"balancer": "nash_mtl", "tasks": "qm9"},
            "seed": seed,
            "higher_is_better": {task: {"mae": False} for task in nash},
            "test": nash,
        }
        (run / "metrics.json").write_text(json.dumps(metrics))
    report = json.loads(make_report([tmp_path], "json", None, None, published="nash_mtl")[0])
    recomputed = report["published"]["qm9"]["mean_rank_recomputed"]
    assert recomputed["groups"]["balancer=nash_mtl"] == recomputed["published"]["Nash-MTL"]
    assert len(recomputed["published"]) == 10


# Runs as `mtl-bench train` leaves them (their composed config saved), with MAEs a multiple of Nash-MTL's printed ones.


def write_qm9_run(root: Path, name: str, overrides: list[str], factor: float) -> None:
    from tests.helpers.run_dirs import saved_run

    run, cfg, choices = saved_run(root, name, overrides)
    table = load("nash_mtl")["qm9"]
    nash = table.metrics(next(r for r in table.rows if r.method == "Nash-MTL"))
    metrics = {
        "status": "completed",
        "overrides": overrides,
        "choices": choices,
        "seed": cfg.seed,
        "higher_is_better": {task: {"mae": False} for task in nash},
        "test": {task: {"mae": v["mae"] * factor} for task, v in nash.items()},
    }
    (run / "metrics.json").write_text(json.dumps(metrics))


@pytest.fixture
def qm9_small(tmp_path: Path) -> Path:
    for balancer, factor in (("fixed", 3.0), ("uw", 2.5)):
        for seed in (0, 1):
            overrides = ["experiment=qm9_small", f"balancer={balancer}", f"seed={seed}"]
            write_qm9_run(tmp_path, f"{balancer}_{seed}", overrides, factor * (1 + 0.02 * seed))
    return tmp_path


def test_published_rows_stand_beside_the_users_in_every_form_with_their_per_metric_values(qm9_small):
    """The paper's per-target MAEs (Table 6, as printed) in the wide table, the markdown report's wide half, the
    CSV and the JSON, next to the user's."""
    wide = make_report([qm9_small], "table", None, None, wide=True, published="nash_mtl")[0]
    nash = next(line for line in wide.splitlines() if "Nash-MTL [published]" in line)
    assert [
        cell.strip() for cell in nash.split("│")[3:14]
    ] == "0.102 0.248 82.95 81.89 2.42 5.38 74.5 75.02 75.10 74.16 0.093".split()
    assert "+62.00" in nash and "homo/mae" in wide
    assert sum(line.startswith("│") and "[published]" in line for line in wide.splitlines()) == 10

    markdown = make_report([qm9_small], "markdown", None, None, published="nash_mtl")[0]
    wide_half = markdown[markdown.index("| group | seeds | mu/mae ↓") :]
    assert "| Nash-MTL [published] | 3 | 0.102 | 0.248 | 82.95 | 81.89 | 2.42 | 5.38 | 74.5 |" in wide_half
    assert "| SI [published] | 3 | 0.309 | 0.345 | 149.8 | 135.7 | 1.00 | 4.50 |" in wide_half  # the printed digits

    rows = list(csv.reader(io.StringIO(make_report([qm9_small], "csv", None, None, published="nash_mtl")[0])))
    by_group = {row[0]: dict(zip(rows[0], row)) for row in rows[1:]}
    assert float(by_group["Nash-MTL [published]"]["homo/mae ↓"]) == 82.95
    assert by_group["Nash-MTL [published]"]["MR printed"] == "2.5"
    assert float(by_group["balancer=uw"]["homo/mae ↓"]) == pytest.approx(82.95 * 2.5 * 1.01)

    report = json.loads(make_report([qm9_small], "json", None, None, published="nash_mtl")[0])
    row = next(r for r in report["published"]["qm9"]["rows"] if r["method"] == "Nash-MTL")
    assert row["metrics"]["homo"] == {"mae": 82.95} and row["metrics"]["cv"] == {"mae": 0.093}


def test_runs_off_the_papers_protocol_are_called_not_comparable_in_every_form(qm9_small, tmp_path):
    """experiment=qm9_small trains 3 epochs on 2,400 molecules: Nash-MTL's rows are 300 epochs on ~110,831."""
    gaps = "trainer.epochs=3 (paper: 300), tasks.n_train=2400 (paper: null), tasks.n_val=1000 (paper: 10000)"
    for wide in (False, True):
        text = " ".join(make_report([qm9_small], "table", None, None, wide=wide, published="nash_mtl")[0].split())
        assert (
            "NOT COMPARABLE with the [published] rows: your runs are not on the protocol of nash_mtl's Table 1" in text
        )
        assert gaps in text and "experiment=qm9" in text
    rows = list(csv.reader(io.StringIO(make_report([qm9_small], "csv", None, None, published="nash_mtl")[0])))
    protocol = {row[0]: dict(zip(rows[0], row))["published protocol"] for row in rows[1:]}
    assert protocol["balancer=uw"].startswith("no: trainer.epochs=3 (paper: 300); tasks.n_train=2400")
    report = json.loads(make_report([qm9_small], "json", None, None, published="nash_mtl")[0])
    off = report["published"]["qm9"]["groups_off_protocol"]
    assert sorted(off) == ["balancer=fixed", "balancer=uw"] and off["balancer=uw"][0] == "trainer.epochs=3 (paper: 300)"

    on = tmp_path / "on"  # the preset itself, as long as the paper's: on the protocol
    for balancer in ("fixed", "uw"):
        write_qm9_run(on, balancer, ["experiment=qm9", f"balancer={balancer}"], 1.0)
    text = " ".join(make_report([on], "table", None, None, published="nash_mtl")[0].split())
    assert "every group ran the length, split and model selection of nash_mtl's Table 1 (experiment=qm9)" in text
    assert "NOT COMPARABLE" not in text
    steps = tmp_path / "steps"  # a length in steps, another selection
    write_qm9_run(steps, "a", ["experiment=qm9", "trainer.max_steps=60", "select=final"], 1.0)
    write_qm9_run(steps, "b", ["experiment=qm9", "trainer.max_steps=60", "select=final", "balancer=uw"], 1.0)
    text = " ".join(make_report([steps], "table", None, None, published="nash_mtl")[0].split())
    assert "trainer.max_steps=60 (paper: trainer.epochs=300), select=final (paper: best_val)" in text
    assert "select.criterion" not in text  # another selection is named once


def test_runs_without_their_config_cannot_be_told_on_or_off_the_protocol(sweep):
    text = " ".join(make_report([sweep], "table", None, None, published="nash_mtl")[0].split())
    assert "cannot tell whether your runs follow the protocol of nash_mtl's Table 3" in text
    assert "unknown (no .hydra/config.yaml saved)" in text


@pytest.mark.parametrize("name", available())
def test_each_tables_protocol_is_what_its_experiment_preset_sets(name):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import mtl_bench.config  # noqa: F401  (registers the schemas)
    from mtl_bench.catalog import conf_root

    for tasks, table in load(name).items():
        assert table.protocol and table.experiment, (name, tasks)
        with initialize_config_dir(str(conf_root()), version_base="1.3"):
            cfg = compose("config", overrides=[f"experiment={table.experiment}"], return_hydra_config=True)
        choices = cfg.hydra.runtime.choices  # a group's key (select) names the option the preset chose
        assert cfg.tasks._target_.rsplit(".", 1)[1].lower() == tasks.replace("_", "")
        for key, value in table.protocol.items():
            found = choices[key] if key in choices else OmegaConf.select(cfg, key)
            assert found == value, (name, tasks, key)


def test_published_labels_never_wrap_beside_a_long_group_label(tmp_path: Path):
    for seed in (0, 1):
        write_run(tmp_path, f"long_{seed}", "gradnorm_" + "x" * 60, seed, 0.70)
        write_run(tmp_path, f"fixed_{seed}", "fixed", seed, 0.72)
    for name in available():
        text = make_report([tmp_path], "table", None, None, published=name)[0]
        lines = text.splitlines()
        assert max(map(len, lines)) <= WIDTH, text
        for row in load(name)["cityscapes"].rows:
            assert any(f"│ {row.method} [published]" in line for line in lines), (name, row.method, text)
