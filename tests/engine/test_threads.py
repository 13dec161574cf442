"""trainer.num_threads=auto: threads from the cores this process may use, the runs its launcher
starts at once, the cores idle now and the model's size; an explicit number wins; null keeps torch's default."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from omegaconf import OmegaConf

from mtl_bench.engine import threads
from mtl_bench.engine.threads import (
    SMALL_MODEL_NUMEL,
    available_cores,
    check_setting,
    choose_threads,
    cores_of,
    parallel_runs_of,
)

BIG = SMALL_MODEL_NUMEL * 4
JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
SUBMITIT_LOCAL = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"
SUBMITIT_SLURM = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
BASIC = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


@pytest.fixture
def cores(monkeypatch):
    """Fake the CPU affinity of this process on a quiet machine: cores(8) means 8 cores allowed, all idle."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)

    def fake(n: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
        monkeypatch.setattr(threads, "idle_cores", lambda: float(n))

    return fake


def launcher(target: str, **keys):
    return OmegaConf.create({"_target_": target, **keys})


# ----------------------------------------------------------------------------- choose_threads


def test_null_keeps_torchs_default():
    n, reason = choose_threads(None, model_numel=BIG, parallel_runs=4)
    assert n == torch.get_num_threads() and "torch's default" in reason


@pytest.mark.parametrize("setting", [3, "3"])
def test_an_explicit_number_wins(cores, setting):
    cores(8)
    assert choose_threads(setting, model_numel=10, parallel_runs=8) == (3, "3 intra-op threads (trainer.num_threads=3)")


@pytest.mark.parametrize("setting", [0, -1, "0", "many", True, 2.5])
def test_a_bad_setting_names_the_key(setting):
    with pytest.raises(ValueError, match=r"trainer.num_threads: must be auto, null or an integer > 0"):
        choose_threads(setting, model_numel=10, parallel_runs=1)


@pytest.mark.parametrize(
    "given, read", [(None, None), ("null", None), ("auto", "auto"), (" Auto ", "auto"), (4, 4), ("4", 4)]
)
def test_the_setting_as_the_config_gives_it(given, read):
    assert check_setting(given) == read


def test_auto_gives_a_small_model_one_thread_whatever_the_cores(cores):
    cores(64)
    n, reason = choose_threads("auto", model_numel=75_600, parallel_runs=1)
    assert n == 1 and "75,600 parameters" in reason and "\n" not in reason


@pytest.mark.parametrize(
    "allowed, runs, expected", [(8, 1, 8), (8, 2, 4), (8, 3, 2), (8, 8, 1), (8, 16, 1), (2, 1, 2), (1, 1, 1)]
)
def test_auto_divides_the_allowed_cores_among_the_runs_at_once(cores, allowed, runs, expected):
    cores(allowed)
    n, reason = choose_threads("auto", model_numel=BIG, parallel_runs=runs)
    assert n == expected
    assert f"{allowed} cores this process may use" in reason


def test_auto_reads_the_affinity_not_the_machine(cores, monkeypatch):
    cores(3)
    monkeypatch.setattr(os, "cpu_count", lambda: 96)
    assert available_cores() == 3
    assert choose_threads("auto", model_numel=BIG, parallel_runs=1)[0] == 3


def test_without_an_affinity_call_auto_counts_the_machines_cores(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(threads, "idle_cores", lambda: 6.0)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert available_cores() == 6
    assert choose_threads("auto", model_numel=BIG, parallel_runs=2)[0] == 3


def test_a_jobs_allotted_cores_cap_the_affinity(cores):
    cores(16)
    assert choose_threads("auto", model_numel=BIG, parallel_runs=1, cores=4)[0] == 4
    cores(2)  # SLURM pinned the job to 2 cores although cpus_per_task says 4
    assert choose_threads("auto", model_numel=BIG, parallel_runs=1, cores=4)[0] == 2


def test_torchrun_ranks_on_one_machine_share_its_cores(cores, monkeypatch):
    cores(8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    n, reason = choose_threads("auto", model_numel=BIG, parallel_runs=1)
    assert n == 4 and "shared by 2 processes" in reason


# ----------------------------------------------------------------------------- load


@pytest.mark.parametrize("idle, expected", [(0.0, 1), (0.6, 1), (1.4, 1), (1.6, 1), (1.85, 1), (1.9, 2), (2.0, 2)])
def test_auto_gives_a_big_model_no_more_threads_than_cores_idle_now(cores, monkeypatch, idle, expected):
    """2 cores under load 4-6 (none idle) gave an MMoE step 2 threads, 20x slower than 1; a core half taken by
    another process is not free either (a thread there stalls every op): only one idle 90% of the window counts."""
    cores(2)
    monkeypatch.setattr(threads, "idle_cores", lambda: idle)
    n, reason = choose_threads("auto", model_numel=BIG, parallel_runs=1)
    assert n == expected and f"{idle:.1f} of them idle now" in reason
    assert ("other processes keep the rest busy" in reason) == (expected < 2)


def test_the_idle_cap_comes_after_the_division_among_runs(cores, monkeypatch):
    cores(16)
    monkeypatch.setattr(threads, "idle_cores", lambda: 9.7)
    assert choose_threads("auto", model_numel=BIG, parallel_runs=1)[0] == 9
    assert choose_threads("auto", model_numel=BIG, parallel_runs=4)[0] == 4


def test_unknown_load_leaves_the_cores_as_they_are(cores, monkeypatch):
    cores(4)
    monkeypatch.setattr(threads, "idle_cores", lambda: None)
    n, reason = choose_threads("auto", model_numel=BIG, parallel_runs=1)
    assert n == 4 and "idle" not in reason


def test_a_small_model_or_one_core_does_not_wait_to_measure_the_load(cores, monkeypatch):
    cores(1)

    def never() -> float:
        raise AssertionError("idle_cores called")

    monkeypatch.setattr(threads, "idle_cores", never)
    assert choose_threads("auto", model_numel=BIG, parallel_runs=1)[0] == 1
    cores(8)
    monkeypatch.setattr(threads, "idle_cores", never)
    assert choose_threads("auto", model_numel=10, parallel_runs=1)[0] == 1
    assert choose_threads(4, model_numel=BIG, parallel_runs=1)[0] == 4


def fake_proc_stat(monkeypatch, tmp_path, first: str, later: str) -> None:
    """/proc/stat reads `first` once, then `later` (the runnable counts read in the window, the last sample)."""
    reads = iter([first])
    real_open = open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/stat":
            stat = tmp_path / "stat"
            stat.write_text(next(reads, later))
            return real_open(stat, *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)


def test_threads_waiting_to_run_take_the_idle_cores_share(monkeypatch, tmp_path):
    """Two other processes runnable on a 2-core machine: the cores are not free even where they looked idle."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    idle = "cpu0 0 0 0 {0} 0 0 0 0 0 0\ncpu1 0 0 0 {0} 0 0 0 0 0 0\nprocs_running {1}\n"
    fake_proc_stat(monkeypatch, tmp_path, idle.format(100, 1), idle.format(200, 3))  # 3: this one and 2 others
    assert threads.idle_cores(window=0.0) == 0.0
    fake_proc_stat(monkeypatch, tmp_path, idle.format(100, 1), idle.format(200, 1))  # only this one
    assert threads.idle_cores(window=0.0) == pytest.approx(2.0)


def test_idle_cores_reads_the_cpus_of_the_affinity(monkeypatch, tmp_path):
    """From /proc/stat's per-CPU lines (idle + iowait over all), only the CPUs this process may run on."""
    fake_proc_stat(
        monkeypatch,
        tmp_path,
        "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 100 0 0 100 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n"
        "cpu2 50 0 0 50 0 0 0 0 0 0\nintr 1 2\n",
        "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 200 0 0 100 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n"
        "cpu2 60 0 0 130 10 0 0 0 0 0\nintr 1 2\n",
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2}, raising=False)
    # cpu0 busy the whole window (0 idle of 100), cpu2 idle 90 of 100; cpu1 is not ours
    assert threads.idle_cores(window=0.0) == pytest.approx(0.9)


def test_idle_cores_on_this_machine_is_between_none_and_all():
    idle = threads.idle_cores(window=0.05)
    if idle is not None:
        assert -1e-9 <= idle <= available_cores() + 1e-9


# ----------------------------------------------------------------------------- launchers


@pytest.mark.parametrize("n_jobs, expected", [(3, 3), (1, 1), (-1, 8), (-2, 7), (-8, 1), (-20, 1), (None, 8)])
def test_joblib_runs_n_jobs_at_once(cores, n_jobs, expected):
    cores(8)
    assert parallel_runs_of(launcher(JOBLIB, n_jobs=n_jobs)) == expected
    assert cores_of(launcher(JOBLIB, n_jobs=n_jobs)) is None


@pytest.mark.parametrize("target", [SUBMITIT_LOCAL, SUBMITIT_SLURM])
def test_submitit_jobs_get_their_cpus_per_task(cores, target):
    cores(16)
    assert parallel_runs_of(launcher(target, cpus_per_task=4)) == 1
    assert cores_of(launcher(target, cpus_per_task=4)) == 4
    assert cores_of(launcher(target, cpus_per_task=None)) is None
    run = launcher(target, cpus_per_task=4)
    assert choose_threads("auto", model_numel=BIG, parallel_runs=parallel_runs_of(run), cores=cores_of(run))[0] == 4


def test_the_basic_launcher_runs_one_job_at_a_time(cores):
    cores(8)
    assert parallel_runs_of(launcher(BASIC)) == 1 and cores_of(launcher(BASIC)) is None
    assert parallel_runs_of(None) == 1


def test_joblib_with_every_core_busy_gives_each_big_run_one_thread(cores):
    cores(8)
    run = launcher(JOBLIB, n_jobs=-1)
    assert choose_threads("auto", model_numel=BIG, parallel_runs=parallel_runs_of(run), cores=cores_of(run))[0] == 1


@pytest.mark.parametrize(
    "option, expected_runs, expected_cores",
    [
        ("joblib", 8, None),
        ("submitit_local", 1, None),
        ("submitit_slurm", 1, None),
        ("slurm", 1, 8),
        ("basic", 1, None),
    ],
)
def test_hydras_own_launcher_configs(cores, option, expected_runs, expected_cores):
    """The launcher nodes as Hydra composes them (hydra.launcher), including this project's slurm preset."""
    from hydra import compose, initialize_config_dir

    from mtl_bench.catalog import conf_root

    if option != "basic":  # the launchers of the sweep extra (pip install -e ".[sweep]")
        pytest.importorskip(
            "hydra_plugins.hydra_joblib_launcher" if option == "joblib" else "hydra_plugins.hydra_submitit_launcher"
        )
    cores(8)
    with initialize_config_dir(str(conf_root()), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={option}"], return_hydra_config=True)
    node = cfg.hydra.launcher
    assert parallel_runs_of(node) == expected_runs and cores_of(node) == expected_cores


# ----------------------------------------------------------------------------- through the recipe


def test_the_recipe_chooses_one_thread_for_the_default_model(compose_cfg, tmp_path, caplog):
    from mtl_bench.engine.recipe import Recipe

    cfg = compose_cfg("trainer=smoke", "tasks.n_train=256", "tasks.n_val=32", "tasks.n_test=32")  # auto: the default
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    recipe = Recipe(cfg, tmp_path)
    try:
        with caplog.at_level(logging.INFO, logger="mtl_bench"):
            recipe.setup()
        assert torch.get_num_threads() == 1
        assert "trainer.num_threads=auto" in caplog.text
    finally:
        recipe.cleanup()
        torch.set_num_threads(before)
