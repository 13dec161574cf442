"""Logged scalars read back the same whichever shipped logger wrote them: a short real run under logger=tensorboard
and one under logger=csv give the same series, so the report's weights panel and the did-it-learn check read both."""

from __future__ import annotations

import pytest

from mtl_bench.analysis.learning import _first_last_from_events, not_learned
from mtl_bench.analysis.runs import Run, scan_runs
from mtl_bench.analysis.scalars import CSVReader, TensorBoardReader, read_scalars
from mtl_bench.engine.recipe import train
from mtl_bench.records import RunRecord
from mtl_bench.report.run_summary import final_weights
from tests.helpers.cli import SMALL

SHORT = [*SMALL, "trainer.max_steps=6", "trainer.log_every=2", "trainer.eval_every=6"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from hydra import compose, initialize_config_dir

    from mtl_bench.catalog import conf_root

    root = tmp_path_factory.mktemp("loggers")
    for logger in ("tensorboard", "csv"):
        with initialize_config_dir(str(conf_root()), version_base="1.3"):
            cfg = compose("config", overrides=[*SHORT, f"logger={logger}"])
        train(cfg, root / logger)
    return root


def test_a_csv_run_reads_as_a_tensorboard_run(runs):
    tb, csv = runs / "tensorboard", runs / "csv"
    assert TensorBoardReader().read(csv, "") is None and CSVReader().read(tb, "") is None  # each finds its own files
    for prefix in ("loss/", "weight/"):
        a, b = read_scalars(tb, prefix), read_scalars(csv, prefix)
        assert a and sorted(a) == sorted(b)
        for tag in a:
            assert [s for s, _ in a[tag]] == [s for s, _ in b[tag]] == [2, 4, 6]
            # the same run (same seed, CPU): TensorBoard stores float32, the CSV file the float64 repr
            assert [v for _, v in a[tag]] == pytest.approx([v for _, v in b[tag]], rel=1e-6)
    tasks = list(RunRecord.read(csv).test)
    assert final_weights(csv, tasks) == pytest.approx(final_weights(tb, tasks), rel=1e-6) != {}
    [run_tb], [run_csv] = scan_runs(tb), scan_runs(csv)
    assert isinstance(run_csv, Run) and run_csv.scalars("loss/").keys() == run_tb.scalars("loss/").keys()
    # did it learn: both judged on the training loss (not on metrics.json's test losses), with the same numbers
    from_tb, from_csv = _first_last_from_events(run_tb, tasks), _first_last_from_events(run_csv, tasks)
    assert isinstance(from_csv, dict) and isinstance(from_tb, dict)
    assert {t: pytest.approx(v, rel=1e-6) for t, v in from_tb.items()} == from_csv
    assert not_learned(run_tb) == not_learned(run_csv)


def test_a_csv_file_under_another_name_is_found_and_nothing_logged_reads_empty(tmp_path):
    (tmp_path / "mine.csv").write_text("step,tag,value\n2,loss/a,0.5\n4,loss/a,0.25\n4,weight/a,1.0\n")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    assert read_scalars(tmp_path, "loss/") == {"loss/a": [(2, 0.5), (4, 0.25)]}
    assert read_scalars(tmp_path / "nowhere", "loss/") == {}
