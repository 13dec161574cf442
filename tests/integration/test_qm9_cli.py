"""QM9 through the command line: `mtl-bench prepare` builds the cache, `mtl-bench train experiment=qm9` (and
qm9_small) train on the real molecules (the first 300) with metrics named by target; bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.cli import run_cli

pytest.importorskip("rdkit")
pytest.importorskip("torch_geometric")

SMALL = ["tasks.limit=300", "tasks.n_test=40", "tasks.n_val=40", "trainer.device=cpu"]


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mtl_bench", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # two CLI processes per preset
@pytest.mark.parametrize("preset", ["qm9", "qm9_small"])
def test_prepare_then_train_a_preset_through_the_cli(tmp_path, preset):
    cache = f"tasks.cache_dir={tmp_path / 'cache'}"
    extra = ["tasks.n_train=100"] if preset == "qm9_small" else []
    prepared = cli("prepare", f"experiment={preset}", *SMALL, *extra, cache, cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    assert "tasks ready" in prepared.stdout and list((tmp_path / "cache" / "qm9").glob("*first300*.pt"))
    run = tmp_path / "run"
    trained = cli(
        "train",
        f"experiment={preset}",
        *SMALL,
        *extra,
        cache,
        "model.dim=16",
        "trainer.epochs=null",
        "trainer.max_steps=2",
        "trainer.eval_every=2",
        "trainer.eval_batch_size=40",
        "trainer.batch_size=16",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert trained.returncode == 0, trained.stderr
    assert "QM9 cache written" not in trained.stderr  # built by prepare, read here
    metrics = json.loads((run / "metrics.json").read_text())
    names = ["mu", "alpha", "homo", "lumo", "r2", "zpve", "u0", "u", "h", "g", "cv"]
    assert list(metrics["test"]) == names and all(metrics["test"][n]["mae"] > 0 for n in names)


def test_bad_options_are_one_line(tmp_path):
    result = run_cli(
        "prepare", "tasks=qm9", *SMALL, "tasks.standardize=median", f"tasks.cache_dir={tmp_path}", cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "mtl-bench: error: tasks.standardize: must be one of train, all, none, got 'median'"
    )
