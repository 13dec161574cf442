"""logger=<option>: TensorBoard and CSV together, a user's own logger by `_target_`, none at all."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from mtl_bench.api import compose_config, run
from mtl_bench.engine.compose import finalise_config
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError
from mtl_bench.loggers import CSVLogger, Logger, RunInfo
from tests.helpers.cli import SMALL

SHORT = [*SMALL, "trainer.max_steps=4", "trainer.log_every=2", "trainer.eval_every=4"]
CALLS: list[tuple[str, object]] = []


class Recording(Logger):
    """A user's logger: records what the run tells it."""

    def __init__(self, run: RunInfo, label: str = "mine") -> None:
        """label: a key of the user's own, to show it is passed."""
        CALLS.append(("init", (run.dir.name, run.resume_step, dict(run.metric_names), run.task_set, label)))

    def log_hparams(self, hparams, metric_tags) -> None:
        CALLS.append(("hparams", hparams["balancer"]))

    def log_scalars(self, scalars, step) -> None:
        CALLS.append(("scalars", (step, sorted(scalars))))

    def log_image(self, tag, image, step) -> None:
        CALLS.append(("image", (tag, image.shape[0], step)))

    def close(self) -> None:
        CALLS.append(("close", None))


def rows(path):
    with path.open() as file:
        return list(csv.DictReader(file))


def test_tensorboard_and_csv_together_receive_scalars_images_and_hparams(tmp_path):
    overrides = ["logger=[tensorboard,csv]", "trainer.diagnostics=true", "trainer.diagnostics_every=2"]
    assert set(compose_config([*SHORT, *overrides]).logger) == {"tensorboard", "csv"}
    run([*SHORT, *overrides], tmp_path)  # the Python API: composes as the CLI does, with the choices
    assert list(tmp_path.glob("events.out.tfevents.*"))
    table = rows(tmp_path / "metrics.csv")
    assert {("2", "loss/t0"), ("4", "loss/t1"), ("4", "metric/val/t0/loss"), ("4", "summary/test_loss_ratio_sum")} <= {
        (r["step"], r["tag"]) for r in table
    }
    final = json.loads((tmp_path / "metrics.json").read_text())["summary"]["test_loss_ratio_sum"]
    logged = [float(r["value"]) for r in table if r["tag"] == "summary/test_loss_ratio_sum"]
    assert logged == [pytest.approx(final)]
    hparams = json.loads((tmp_path / "hparams.json").read_text())
    assert hparams["hparams"]["balancer"] == "fixed" and "metric/test/t0/loss" in hparams["metric_tags"]
    assert sorted(p.name for p in (tmp_path / "images" / "grad_cos" / "heatmap").iterdir()) == ["2.png", "4.png"]


def test_a_users_logger_by_target_gets_every_call_and_is_closed(tmp_path):
    CALLS.clear()
    target = f"{__name__}.Recording"
    overrides = ["~logger", f"+logger.mine._target_={target}", "+logger.mine.label=lab"]
    run([*SHORT, *overrides], tmp_path / "run")
    kinds = [kind for kind, _ in CALLS]
    assert kinds[:2] == ["init", "hparams"] and kinds[-1] == "close" and kinds.count("close") == 1
    name, resume_step, metrics, task_set, label = CALLS[0][1]  # type: ignore[misc]
    assert (name, resume_step, task_set, label) == ("run", None, "toy", "lab")
    assert set(metrics) == {"t0", "t1"} and all(names[0] == "loss" for names in metrics.values())
    steps = [value[0] for kind, value in CALLS if kind == "scalars"]  # type: ignore[index]
    assert steps[:2] == [2, 4] and not list((tmp_path / "run").glob("events.out.tfevents.*"))


def test_without_loggers_nothing_but_the_run_record_is_written(compose_cfg, tmp_path):
    train(compose_cfg(*SHORT, "~logger"), tmp_path)
    assert not list(tmp_path.glob("events.out.tfevents.*")) and not (tmp_path / "metrics.csv").exists()
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "completed"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["logger=csv", "+logger.csv.nonsense=1"], "logger.csv.nonsense: not an option of mtl_bench.loggers.CSVLogger"),
        (["logger=csv", "logger.csv.filename=a/b.csv"], "logger.csv.filename: must be a plain file name"),
        (["+logger.mine=1"], "logger.mine: expected a node with _target_, got 1"),
        (["logger=csv", "+logger.csv.run=x"], "logger.csv.run: given by the engine at build time, not a config option"),
    ],
)
def test_logger_keys_are_checked_and_named(compose_cfg, tmp_path, overrides, message):
    cfg = compose_cfg(*SHORT, *overrides)
    with pytest.raises(ConfigError) as err:
        finalise_config(cfg, overrides)
        train(cfg, tmp_path, overrides=overrides)
    assert str(err.value).startswith(message)


def test_csv_logger_drops_the_rows_a_resumed_run_repeats(tmp_path):
    first = CSVLogger(RunInfo(tmp_path))
    for step in (1, 2, 3):
        first.log_scalars({"loss/a": float(step)}, step)
    first.log_image("x/y", np.zeros((3, 2, 2)), 3)
    first.close()
    resumed = CSVLogger(RunInfo(tmp_path, resume_step=2))
    resumed.log_scalars({"loss/a": 30.0}, 3)
    resumed.close()
    assert [(r["step"], r["value"]) for r in rows(tmp_path / "metrics.csv")] == [
        ("1", "1.0"),
        ("2", "2.0"),
        ("3", "30.0"),
    ]
    assert (tmp_path / "images" / "x" / "y" / "3.png").is_file()
