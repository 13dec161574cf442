"""Every preset of the standard benchmarks trains 2 steps through the CLI on a tiny tree in its real on-disk
format, with every metric in metrics.json and TensorBoard; `mtl-bench report -b reference` on a sweep of one
prints Δm, mean rank and 95% intervals. The models are narrowed or the images shrunk where the preset allows
(the test is about the plumbing from command line to metrics; each model's numbers are tested in its own file)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtl_bench.catalog import config_options
from tests.helpers.celeba_tree import write_celeba
from tests.helpers.dense_tree import write_cityscapes, write_nyuv2
from tests.helpers.office_tree import write_office31, write_office_home

pytestmark = pytest.mark.slow  # a CPU process per preset, full-size NYUv2 images

SHORT = [
    "trainer.epochs=null",
    "trainer.max_steps=2",
    "trainer.batch_size=2",
    "trainer.eval_every=2",
    "trainer.log_every=1",
    "trainer.checkpoint_every=0",
    "trainer.num_workers=0",
    "trainer.device=cpu",
]
PRESETS = {  # preset: (writes its tree, overrides that narrow it)
    "nyuv2_segnet_mtan": (
        lambda root: write_nyuv2(root, n_train=4, n_val=2),
        ["model.filters=[4,8,8,8,8]", "trainer.eval_batch_size=2"],
    ),
    "cityscapes_segnet_mtan": (lambda root: write_cityscapes(root, n_train=4, n_val=2), ["model.filters=[4,8,8,8,8]"]),
    "nyuv2_resnet_dilated": (
        lambda root: write_nyuv2(root, n_train=4, n_val=2),
        ["model.output_stride=16", "trainer.eval_batch_size=2"],
    ),
    "celeba_cnn": (lambda root: write_celeba(root, n=6), ["model.channels=[4,4,4,4]", "model.hidden=8"]),
    "office31_resnet18": (lambda root: write_office31(root, per_class=5), ["tasks.image_size=32"]),
    "office_home_resnet18": (lambda root: write_office_home(root, per_class=5), ["tasks.image_size=32"]),
}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mtl_bench", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=900,
    )


def test_every_benchmark_preset_is_covered_here():
    from tests.helpers.cli import ON_DISK

    # the QM9 presets read a cache built from qm9pack, not a tree: tests/integration/test_qm9_cli.py runs them
    on_disk = {e for e in config_options()["experiment"] if e.startswith(ON_DISK) and not e.startswith("qm9")}
    assert on_disk == set(PRESETS)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_preset_trains_two_steps_through_the_cli(tmp_path, preset):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write, narrow = PRESETS[preset]
    root = write(tmp_path / "data")
    run = tmp_path / "run"
    result = cli(
        "train", f"experiment={preset}", f"tasks.root={root}", *narrow, *SHORT, f"hydra.run.dir={run}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["step"] == 2
    expected = {task: sorted({"loss", *names}) for task, names in metrics["higher_is_better"].items()}
    assert {task: sorted(values) for task, values in metrics["test"].items()} == expected
    assert all(math.isfinite(v) for values in metrics["test"].values() for v in values.values())
    events = EventAccumulator(str(run))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {f"metric/test/{task}/{name}" for task, names in expected.items() for name in names} <= scalars


def test_report_ranks_a_sweep_of_a_preset_against_its_reference(tmp_path):
    root = write_nyuv2(tmp_path / "nyuv2", n_train=4, n_val=2)
    sweep = tmp_path / "sweep"
    result = cli(
        "train",
        "-m",
        "experiment=nyuv2_segnet_mtan",
        f"tasks.root={root}",
        "model.filters=[4,8,8,8,8]",
        "trainer.eval_batch_size=2",
        *SHORT,
        "balancer=fixed,uw",
        "seed=0,1",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = cli("report", str(sweep), "-b", "reference", "--format", "json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    groups = {g["group"]: g for g in json.loads(report.stdout)["groups"]}
    assert set(groups) == {"balancer=fixed", "balancer=uw"} and all(g["seeds"] == 2 for g in groups.values())
    for group in groups.values():
        assert all(math.isfinite(group["delta_m"][k]) for k in ("flat", "task_averaged"))
        assert group["delta_m_ci95"]["flat"] > 0  # two seeds: an interval
        assert 1 <= group["mean_rank"] <= 2
        assert group["metrics"]["normal"]["angle_mean"]["ci95"] > 0
    table = cli("report", str(sweep), "-b", "reference", cwd=tmp_path).stdout
    assert "Δm" in table and "mean rank" in table and "±" in table
