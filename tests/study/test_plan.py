"""A study's config and plan, without training: presets load, the plan expands to the right runs, every row gets
the same budget, the search spaces are what they say, bad keys are one line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mtl_bench.errors import ConfigError
from mtl_bench.study.plan import final_runs, trials, tuning_runs
from mtl_bench.study.space import interior_lattice, latin_hypercube, scalarization_weights
from mtl_bench.study.spec import load_study, presets

TASKS = [f"t{i}" for i in range(10)]


def test_presets():
    assert {"toy10", "digits", "qm9", "nyuv2"} <= set(presets())
    for name in presets():
        cfg = load_study(name, [])
        assert cfg.budget >= 1 and cfg.seeds and cfg.about


def test_toy10_plan_expands_to_every_row_with_the_same_budget():
    cfg = load_study("toy10", [])
    runs = tuning_runs(cfg, TASKS)
    rows = ["single_task-" + t for t in TASKS] + ["equal", "scalarization", "uw", "dwa"]
    assert [r.id for r in runs] == [f"tune/{row}/t{i:02d}" for row in rows for i in range(cfg.budget)]
    per_row = {row: sum(r.row == row for r in runs) for row in rows}
    assert set(per_row.values()) == {cfg.budget}  # the equal budget
    assert all(r.seed == cfg.tune_seed for r in runs)
    for run in runs:
        assert run.overrides[: len(cfg.experiment)] == list(cfg.experiment)
        assert run.overrides[-1] == f"seed={cfg.tune_seed}"
        lr = run.settings["optim.lr"]
        assert 1e-4 <= lr <= 1e-2 and f"optim.lr={lr}" in run.overrides
        if run.row.startswith("single_task-"):
            task = run.row.removeprefix("single_task-")
            assert run.settings["trainer.only_tasks"] == [task] and f"trainer.only_tasks=[{task}]" in run.overrides
        if run.row == "scalarization":
            weights = run.settings["balancer.weights"]
            assert list(weights) == TASKS and sum(weights.values()) == pytest.approx(10, rel=1e-3)
        if run.row == "dwa":
            assert 1.0 <= run.settings["balancer.temperature"] <= 4.0
        assert "balancer=" + ("uw" if run.row == "uw" else "dwa" if run.row == "dwa" else "fixed") in run.overrides
    chosen = {row: next(r for r in runs if r.row == row) for row in rows}
    final = final_runs(cfg, chosen)
    assert [r.id for r in final] == [f"final/{row}/s{s}" for row in rows for s in cfg.seeds]
    assert all(r.overrides[-1] == f"seed={r.seed}" and r.settings == chosen[r.row].settings for r in final)


def test_the_plan_is_the_same_every_time_and_changes_with_the_sampler_seed():
    cfg = load_study("toy10", [])
    again = load_study("toy10", [])
    assert [r.overrides for r in tuning_runs(cfg, TASKS)] == [r.overrides for r in tuning_runs(again, TASKS)]
    other = load_study("toy10", ["sampler_seed=1"])
    assert [r.overrides for r in tuning_runs(cfg, TASKS)] != [r.overrides for r in tuning_runs(other, TASKS)]


def test_latin_hypercube_puts_one_trial_in_each_stratum():
    points = latin_hypercube(
        {"lr": {"loguniform": [1e-4, 1e-2]}, "a": {"uniform": [0, 1]}}, 8, np.random.default_rng(0)
    )
    strata = sorted(int((math.log10(p["lr"]) + 4) / 2 * 8) for p in points)
    assert strata == list(range(8))
    assert sorted(int(p["a"] * 8) for p in points) == list(range(8))
    choice = latin_hypercube({"c": {"choice": ["x", "y"]}}, 4, np.random.default_rng(0))
    assert sorted(p["c"] for p in choice) == ["x", "x", "y", "y"]


@pytest.mark.parametrize("kind", ["loguniform", "lattice", "dirichlet"])
@pytest.mark.parametrize("tasks", [2, 3, 5])
def test_every_weight_space_starts_with_equal_weights(kind, tasks):
    names = [f"t{i}" for i in range(tasks)]
    weights = scalarization_weights(names, 6, np.random.default_rng(0), kind)
    assert len(weights) == 6 and weights[0] == {name: 1.0 for name in names}
    assert all(min(w.values()) > 0 and sum(w.values()) == pytest.approx(tasks, rel=1e-3) for w in weights)
    assert len({tuple(w.values()) for w in weights}) == 6  # no trial repeats another (or equal weights)


def test_lattice_and_loguniform_weights():
    rng = np.random.default_rng(0)
    two = scalarization_weights(["a", "b"], 4, rng, "lattice")  # resolution 5 (4 without (1, 1) is too small)
    assert two[0] == {"a": 1.0, "b": 1.0}
    assert set(w["a"] for w in two[1:]) < {0.4, 0.8, 1.2, 1.6} and len({w["a"] for w in two[1:]}) == 3
    assert len(interior_lattice(3, 5)) == 6
    # Log-uniform in [0.1, 10]: ratios far beyond what the simplex lattice of a small budget reaches (the digits
    # task set's sum loss is ~6x the classifiers'); 20 trials put one weight per task stratum of log10 [-1, 1].
    wide = scalarization_weights(["a", "b", "c"], 21, rng, "loguniform", (0.1, 10.0))
    ratios = [max(w.values()) / min(w.values()) for w in wide]
    assert max(ratios) > 10


def test_rows_share_their_learning_rates_and_scalarization_contains_equal_weights():
    cfg = load_study("toy10", ["budget=4"])
    points = trials(cfg, TASKS)
    lrs = {row: [p["optim.lr"] for p in trial] for row, trial in points.items()}
    assert len({tuple(v) for v in lrs.values()}) == 1  # common random numbers: trial i has one lr in every row
    assert points["scalarization"][0]["balancer.weights"] == {t: 1.0 for t in TASKS}
    assert points["dwa"][0]["optim.lr"] == points["equal"][0]["optim.lr"]
    assert len({p["balancer.temperature"] for p in points["dwa"]}) == 4  # a method's own space is its own


def test_methods_can_be_restricted_from_the_command_line():
    assert list(load_study("digits", ["~methods.dwa"]).methods) == [
        "uw",
        "famo",
        "rlw",
        "pcgrad",
        "imtl",
        "nash_mtl",
        "upgrad",
    ]
    only = load_study("digits", ["methods={uw:{balancer:uw},mine:{balancer:mgda}}"])
    assert list(only.methods) == ["uw", "mine"]
    added = load_study("toy10", ["+methods.mine={balancer:mgda}"])
    assert list(added.methods) == ["uw", "dwa", "mine"]
    with pytest.raises(ConfigError, match="~methods.nope: no such key to delete"):
        load_study("toy10", ["~methods.nope"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["nonsense=1"], "nonsense: not a study key"),
        (["budget=0"], "budget=0: must be >= 1"),
        (["seeds=[1,1]"], "seeds=[1, 1]: give one or more distinct seeds"),
        (["select=accuracy"], "select=accuracy: allowed: delta_m or <task>/<metric>"),
        (["reference=paper"], "reference=paper: allowed: single_task, published"),
        (["space.optim.lr={loguniform:[0,1]}"], "space.optim.lr.loguniform: lo must be > 0"),
        (["methods.equal={balancer:fixed}"], "methods.equal: a built-in row"),
        (["methods.gn={balancer:gradnorm,space:{balancer.alpha:{normal:[0,1]}}}"], "methods.gn.space.balancer.alpha"),
        (["budget=abc"], "budget"),
        (["seeds=[0,1]"], "seeds=[0, 1]: contains tune_seed=0"),
        (["scalarization.weights=grid"], "scalarization.weights=grid: allowed: loguniform, lattice, dirichlet"),
        (["scalarization.range=[0,1]"], "scalarization.range=[0.0, 1.0]: [lo, hi] with 0 < lo < hi"),
        (["scalarization.weights=lattice", "scalarization.range=[1,2]"], "scalarization.range: read by"),
        (["min_effect=0"], "min_effect=0.0: must be > 0"),
        (["budgte=3"], "did you mean 'budget'?"),
        (["methods.uw.spce={}"], "did you mean 'space'?"),
    ],
)
def test_bad_study_keys_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_study("toy10", overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unknown_preset_names_the_presets(tmp_path):
    with pytest.raises(ConfigError, match="no such preset; presets: .*toy10"):
        load_study("nope", [])
    with pytest.raises(ConfigError, match="no such study file"):
        load_study(str(tmp_path / "x.yaml"), [])


def test_experiment_may_not_set_what_the_study_sets():
    cfg = load_study("toy10", [])
    cfg.experiment.append("balancer=uw")
    with pytest.raises(ConfigError, match="experiment: balancer=uw is set by the study"):
        tuning_runs(cfg, TASKS)


@pytest.mark.parametrize("preset", ["toy10", "digits", "qm9", "nyuv2"])
def test_every_row_of_every_preset_composes_and_passes_the_config_check(compose_cfg, preset):
    """Each row's first trial as `mtl-bench train` would compose it: balancer options, fixed keys and tuned keys
    exist and have legal values (nothing is built or trained)."""
    from mtl_bench.engine.compose import finalise_config

    cfg = load_study(preset, [])
    runs = tuning_runs(cfg, list(cfg.tasks))
    for row in dict.fromkeys(r.row for r in runs):
        run = next(r for r in runs if r.row == row)
        composed = compose_cfg(*run.overrides)
        finalise_config(composed, run.overrides)
        assert composed.seed == cfg.tune_seed


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("hydra/launcher=nope", "hydra/launcher=nope: no such option"),
        ("methods.dwa.keys={balancer.temprature:2}", "balancer.temprature: no such key"),
        ('experiment=["experiment=toy10","trainer.max_stepz=3"]', "trainer.max_stepz: no such key"),
    ],
)
def test_a_bad_launcher_experiment_or_method_key_stops_the_study_before_its_plan(tmp_path, override, message):
    from tests.helpers.cli import run_cli

    result = run_cli("study", "toy10", f"dir={tmp_path / 'study'}", override)
    assert result.returncode == 2 and result.stderr.startswith("mtl-bench: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "study").exists()


def test_study_help_lists_every_study_key():
    import re

    from mtl_bench.cli import STUDY_KEYS
    from mtl_bench.study.spec import study_keys

    words = set(re.findall(r"[a-z_]+", STUDY_KEYS))
    assert set(study_keys()) <= words


def test_tasks_null_reads_the_task_names_of_every_kind_of_task_set():
    from mtl_bench.study.launch import task_names

    # digits has tasks.front_reference, a key the engine reads itself (it once made this a TypeError)
    assert task_names(["experiment=digits_lenet", "tasks.n_train=64", "tasks.n_val=32", "tasks.n_test=32"]) == [
        "left",
        "right",
        "sum",
    ]
    assert task_names(["experiment=toy10", "tasks.n_train=8", "tasks.n_val=8", "tasks.n_test=8"]) == TASKS


def test_a_run_stopped_inside_a_study_names_the_study_command(monkeypatch):
    from mtl_bench.engine.preemption import resume_hint
    from mtl_bench.errors import RESUME_HINT_ENV

    assert "trainer.resume=auto" in resume_hint("outputs/x")
    monkeypatch.setenv(RESUME_HINT_ENV, "Resume the study with: mtl-bench study toy10")
    assert resume_hint("outputs/x") == "Resume the study with: mtl-bench study toy10"
