"""The `mtl-bench` command: help, Hydra pass-through, sweeps, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mtl_bench.catalog import config_options
from mtl_bench.cli import app
from tests.helpers.cli import ON_DISK, SMOKE, cli, run_cli


def test_root_help_lists_subcommands_without_importing_torch():
    code = (
        "import sys; from typer.testing import CliRunner; from mtl_bench.cli import app; "
        "r = CliRunner().invoke(app, ['--help']); print(r.output); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "train" in out and "list" in out
    assert out.strip().endswith("False")


def test_train_help_is_a_short_summary_within_100_columns_pointing_to_the_docs():
    result = run_cli("train", "--help")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 100 and len(lines) <= 60, result.stdout
    assert "mtl-bench train" in result.stdout and "schema/" not in result.stdout
    assert "docs/configuration.md" in result.stdout and "--cfg job" in result.stdout
    assert "_target_" not in result.stdout  # the composed config is --cfg job's, not the help's
    groups = " ".join(result.stdout.split("Config groups")[1].split("Keys (")[0].split())  # wrapped lines joined
    for group, options in config_options().items():
        assert f"{group}: {', '.join(options)}" in groups
    from mtl_bench.config import HELP_KEYS, RunConf, options

    described = dict(options(RunConf))
    text = " ".join(result.stdout.split())
    for key in HELP_KEYS:  # each with its default and its declared help
        assert f"{key}=" in text and " ".join(described[key].metadata["help"].split()) in text


def test_prepare_help_says_what_it_takes():
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["prepare", "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "[OVERRIDES]..." in text and "GROUP=OPTION and KEY=VALUE" in text and "mtl-bench prepare tasks=qm9" in text


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["balancer=fixed", "-m", "seed=0,1"],
            "seed=0,1 comes after Hydra's flag -m: Hydra's flags go before the overrides: "
            "mtl-bench train -m balancer=fixed seed=0,1",
        ),
        (
            ["balancer=fixed", "--cfg", "job", "seed=1"],
            "seed=1 comes after Hydra's flags --cfg job: Hydra's flags go before the overrides: "
            "mtl-bench train --cfg job balancer=fixed seed=1",
        ),
    ],
)
def test_hydras_flags_after_an_override_are_named_with_the_command_in_order(args, expected):
    result = run_cli("train", *args)
    assert result.returncode == 2 and result.stderr.strip() == f"mtl-bench: error: {expected}", result.stderr
    assert "unrecognized arguments" not in result.stderr


def test_cfg_job_prints_the_composed_config():
    result = run_cli("train", "--cfg", "job", "optim=sgd", "optim.lr=0.05", "optim/schedule=cosine")
    assert result.returncode == 0
    assert "_target_: torch.optim.SGD" in result.stdout and "lr: 0.05" in result.stdout
    assert "_target_: mtl_bench.optim.Cosine" in result.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["optim=nope"],
            "mtl-bench: error: optim=nope: no such option; allowed: adam, adamw, custom, scaled_adam, sgd",
        ),
        (["optim.lr=abc"], "mtl-bench: error: optim.lr: expected float | torch.Tensor, got 'abc'"),
        (["optim.lrr=1"], "mtl-bench: error: optim.lrr: no such key (did you mean optim.lr?); keys of optim: "),
        (["optim"], "mtl-bench: error: cannot parse the override"),
        (["optim.lr=-1"], "mtl-bench: error: optim.lr: Invalid learning rate: -1"),
        (["balancer.weights={t0:1.0,t7:2.0}"], "mtl-bench: error: balancer.weights: weights for unknown tasks"),
        (
            ["balancer.name=gradnorm"],
            "mtl-bench: error: balancer.name: no such key; choose an option with balancer=<option>",
        ),
        (
            ["model.name=lenet"],
            "mtl-bench: error: model.name: no such key; choose an option with model=<option> "
            "(celeba_cnn, decision, lenet, mlp, ",
        ),
        (
            ["model._target_=no.such.Class"],
            "mtl-bench: error: model._target_: cannot import 'no.such.Class' (No module named 'no')",
        ),
        (
            ["model._target_=mtl_bench.tasks.Digits"],
            "mtl-bench: error: model._target_: mtl_bench.tasks.Digits built a Digits, not a "
            "mtl_bench.models.base.MultiTaskModel",
        ),
        (["model._target_=torch.nn.Linear"], "mtl-bench: error: model.in_features: torch.nn.Linear needs it"),
        (
            ["+balancer.nonsense=1"],
            "mtl-bench: error: balancer.nonsense: not an option of mtl_bench.balancers.FixedWeights; options: weights",
        ),
        (["balancer=gradnorm", "balancer.alpha=-1"], "mtl-bench: error: balancer.alpha: must be a number >= 0, got -1"),
        (
            ["precision=fp16", "precision.loss_scale=auto"],
            "mtl-bench: error: precision.loss_scale: must be dynamic, a number > 0",
        ),
        (
            ["trainer.step_mode=tasks"],
            "mtl-bench: error: trainer.step_mode='tasks' is not allowed: allowed: joint, per_task",
        ),
    ],
)
def test_user_errors_are_one_clear_line_without_traceback(tmp_path, args, expected):
    """In this process (an exception that escaped would fail the test here); the two tests below run a fresh one."""
    result = run_cli("train", *args, f"hydra.run.dir={tmp_path / 'run'}", *SMOKE)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["optim=nope"],
            "mtl-bench: error: optim=nope: no such option; allowed: adam, adamw, custom, scaled_adam, sgd",
        ),
        (["balancer=gradnorm", "balancer.alpha=-1"], "mtl-bench: error: balancer.alpha: must be a number >= 0, got -1"),
    ],
    ids=["composition", "build"],
)
def test_a_users_shell_sees_one_line_and_exit_status_2(tmp_path, args, expected):
    """As a shell runs it: a composition error (before torch is imported) and a build error (after)."""
    result = cli("train", *args, f"hydra.run.dir={tmp_path / 'run'}", *SMOKE)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [expected]


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_missing_data_directory_is_one_line_before_torch_is_imported(tmp_path, kind):
    """tasks.root that is no folder is reported before the engine (torch, the task sets) is imported: it took
    11-17 s on a loaded 2-core machine, most of it imports."""
    root = tmp_path / "nowhere"
    if kind == "a file":
        root.write_text("")
    code = (
        "import sys; from mtl_bench.cli import main; "
        f"sys.argv = ['mtl-bench', 'train', 'tasks=nyuv2', 'model=segnet', 'tasks.root={root}', "
        f"'hydra.run.dir={tmp_path / 'run'}']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    what = "does not exist" if kind == "missing" else "is not a directory"
    assert (
        result.stderr.strip()
        == f"mtl-bench: error: tasks.root: {root} {what}; tasks=nyuv2 reads its data from this folder"
    )
    assert result.stdout.strip() == "exit 2 False"
    assert not (tmp_path / "run").exists()


def test_the_early_data_root_check_leaves_what_it_cannot_judge_to_the_task_set(tmp_path):
    from omegaconf import OmegaConf

    from mtl_bench.errors import ConfigError
    from mtl_bench.train import check_data_root

    for node in ({"root": None}, {"root": " "}, {"n_train": 1}, {"root": "${nowhere}"}, {"root": "???"}):
        check_data_root(OmegaConf.create({"tasks": node}), "toy")  # a null root: the task set says if it needs one
    check_data_root(OmegaConf.create({"tasks": {"root": str(tmp_path)}}), "nyuv2")
    with pytest.raises(ConfigError, match=rf"^tasks.root: {tmp_path}/x does not exist; the task set reads"):
        check_data_root(OmegaConf.create({"tasks": {"root": str(tmp_path / "x")}}), None)


def test_nonfinite_raise_ends_the_log_with_one_error_line(tmp_path):
    # diverges in two steps: a training failure reported like a user error, after the run's own log lines
    result = run_cli(
        "train", "optim=sgd", "optim.lr=1e8", "trainer.on_nonfinite=raise", f"hydra.run.dir={tmp_path}", *SMOKE
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip().splitlines()[-1].startswith("mtl-bench: error: non-finite loss for task 't0' at step 2")
    )


def test_train_runs_in_process_and_writes_a_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", f"hydra.run.dir={run_dir}", *SMOKE])
    assert result.exit_code == 0, result.output
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["step"] == 20
    assert (run_dir / ".hydra" / "overrides.yaml").is_file()
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert list(run_dir.glob("events.out.tfevents.*"))
    assert (run_dir / "train.log").read_text().count("step") > 0


def test_multirun_sweep_names_run_dirs_by_overrides(tmp_path):
    result = CliRunner().invoke(
        app, ["train", "-m", "optim=sgd,adam", "seed=0,1", f"hydra.sweep.dir={tmp_path}", *SMOKE]
    )
    assert result.exit_code == 0, result.output
    runs = sorted(p.parent.name for p in tmp_path.glob("*/metrics.json"))
    assert len(runs) == 4
    assert any("optim=sgd" in name and "seed=1" in name for name in runs)


def test_list_shows_groups():
    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0
    tasks = "cagrad_toy, celeba, cityscapes, digits, nyuv2, office31, office_home, pareto_toy, qm9, toy, toy10"
    assert f"tasks: {tasks}" in result.output


# Presets of the standard benchmarks read data from tasks.root: tests/integration/test_benchmark_presets.py runs them on
# tiny trees in the real format; the QM9 presets (a cache of the whole dataset): tests/integration/test_qm9_cli.py.


def test_every_experiment_preset_runs(tmp_path):
    generated = [e for e in config_options()["experiment"] if not e.startswith(ON_DISK)]
    result = CliRunner().invoke(
        app,
        [
            "train",
            "-m",
            f"experiment={','.join(generated)}",
            f"hydra.sweep.dir={tmp_path}",
            "trainer.max_steps=10",
            "trainer.eval_every=5",
            "trainer.log_every=5",
            "tasks.n_train=256",
            "tasks.n_val=32",
            "tasks.n_test=32",
        ],
    )
    assert result.exit_code == 0, result.output
    finished = {json.loads(p.read_text())["choices"]["experiment"] for p in tmp_path.glob("*/metrics.json")}
    assert finished == set(generated) and "gradnorm_toy" in finished


@pytest.mark.slow
def test_default_train_command_as_a_new_user_runs_it(tmp_path):
    result = cli("train", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (metrics_file,) = tmp_path.glob("outputs/*/*/metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["status"] == "completed" and metrics["step"] == 1000
    assert set(metrics["test"]) == {"t0", "t1"}
