"""Sweeps: a failed job does not stop the others; joblib jobs choose their threads (trainer.num_threads=auto);
submitit's local executor runs a sweep; the shipped SLURM and Optuna configs compose; a missing plugin
names its extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.cli import run_cli

SMOKE = ["trainer=smoke", "tasks.n_train=512", "tasks.n_val=64", "tasks.n_test=64"]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mtl_bench", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def statuses(sweep: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["status"] for p in sweep.glob("*/metrics.json")}


def test_a_failed_job_leaves_the_other_jobs_and_is_reported(tmp_path):
    result = run_cli("train", "-m", "optim.lr=-1,0.001", f"hydra.sweep.dir={tmp_path / 'sweep'}", *SMOKE, cwd=tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("mtl-bench: error: a job of the sweep failed (optim.lr: Invalid learning rate: -1)")
    )
    assert sorted(statuses(tmp_path / "sweep").values()) == ["completed", "failed"]
    report = run_cli("report", str(tmp_path / "sweep"), cwd=tmp_path)
    assert report.returncode == 0 and "failed:" in report.stdout and "optim.lr=-1" in report.stdout


@pytest.mark.slow  # joblib's worker processes each start torch anew: 20-45 s
def test_joblib_sweep_runs_jobs_in_parallel_with_capped_threads(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    result = cli(
        "train",
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "seed=0,1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *SMOKE,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert list(statuses(tmp_path / "sweep").values()) == ["completed", "completed"]
    for log in (tmp_path / "sweep").glob("*/train.log"):  # the default MLP is small: auto gives it 1 thread
        assert "1 intra-op thread (trainer.num_threads=auto" in log.read_text()


@pytest.mark.slow  # submitit's local jobs each start torch anew: 20-45 s
def test_submitit_local_sweep(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    result = cli(
        "train",
        "-m",
        "hydra/launcher=submitit_local",
        "seed=0,1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *SMOKE,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert list(statuses(tmp_path / "sweep").values()) == ["completed", "completed"]


def test_shipped_slurm_launcher_config_composes(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    result = cli("train", "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "--cfg", "hydra", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    launcher = OmegaConf.create(result.stdout)["hydra"]["launcher"]
    assert launcher["_target_"].endswith("SlurmLauncher") and launcher["partition"] == "gpu"
    assert launcher["gpus_per_node"] == 1 and launcher["timeout_min"] == 120


@pytest.mark.slow  # two trials through Optuna's sweeper, in a fresh process: 20-45 s
def test_optuna_sweeper_tunes_gradnorm_alpha(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    result = cli(
        "train",
        "-m",
        "hydra/sweeper=gradnorm_alpha",
        "hydra.sweeper.n_trials=2",
        "balancer=gradnorm",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *SMOKE,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Best parameters: {'balancer.alpha'" in result.stdout + result.stderr
    assert len(statuses(tmp_path / "sweep")) == 2


def test_a_launcher_that_is_not_installed_names_the_extra(compose_cfg):
    from hydra.errors import MissingConfigException

    from mtl_bench.hydra_errors import describe

    with pytest.raises(MissingConfigException) as info:
        compose_cfg("hydra/launcher=ray")
    message = describe(info.value)
    assert message.startswith("hydra/launcher=ray: no such option; allowed: basic")
    assert "pip install 'mtl-bench[sweep]'" in message


@pytest.mark.parametrize(
    ("plugin", "preset", "extra"),
    [
        ("hydra_submitit_launcher", "hydra/launcher=slurm", "pip install 'mtl-bench[sweep]'"),
        ("hydra_optuna_sweeper", "hydra/sweeper=gradnorm_alpha", "pip install 'mtl-bench[optuna]'"),
    ],
)
def test_a_preset_whose_plugin_is_missing_names_the_extra(tmp_path, plugin, preset, extra):
    code = (
        f"import sys; sys.modules['hydra_plugins.{plugin}'] = None; "  # as if the plugin were not installed
        f"sys.argv = ['mtl-bench', 'train', '-m', '{preset}']; from mtl_bench.cli import main; main()"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"mtl-bench: error: {preset}: needs ") and extra in line
