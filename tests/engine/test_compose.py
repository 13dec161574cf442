"""What a user types is used or refused before anything is built (engine/compose.py finalise_config)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from mtl_bench.engine.compose import finalise_config
from mtl_bench.errors import ConfigError
from mtl_bench.optim.schedules import MultiStep, StepDecay, to_steps
from tests.helpers.cli import SMOKE, run_cli


@pytest.fixture
def checked(compose_cfg):
    def _checked(*overrides: str):
        cfg = compose_cfg(*overrides)
        finalise_config(cfg, list(overrides))
        return cfg

    return _checked


@pytest.mark.parametrize(
    "override, expected",
    [
        ("+trainer.max_step=100", "trainer.max_step: not a key of trainer (did you mean max_steps?)"),
        ("+trainer.grad_clip.max_nrom=1", "trainer.grad_clip.max_nrom: not a key of trainer.grad_clip (did you mean"),
        ("+nonsense=1", "nonsense: not a key of the config; free-form labels go under tag: +tag.<name>=<value>"),
        ("+balancer.diagnostics=true", "balancer.diagnostics: not an option of"),
    ],
)
def test_unknown_keys_are_refused_with_the_closest_valid_key(checked, override, expected):
    with pytest.raises(ConfigError, match=None) as err:
        checked(override)
    assert str(err.value).startswith(expected)


def test_labels_go_under_tag(checked):
    assert OmegaConf.to_container(checked("+tag.lab=ours", "+tag.round=2").tag) == {"lab": "ours", "round": 2}
    assert checked("tag=baseline").tag == "baseline"


def test_a_length_typed_on_the_command_line_replaces_the_presets(checked):
    cfg = checked("experiment=celeba_cnn", "trainer.max_steps=10")
    assert (cfg.trainer.max_steps, cfg.trainer.epochs) == (10, None)
    cfg = checked("trainer.epochs=3")
    assert (cfg.trainer.max_steps, cfg.trainer.epochs) == (None, 3)
    with pytest.raises(ConfigError, match="trainer.max_steps and trainer.epochs: give one of them"):
        checked("trainer.max_steps=10", "trainer.epochs=2")


def test_trainer_smoke_shortens_any_preset_and_typed_keys_win(checked):
    cfg = checked("experiment=nyuv2_segnet_mtan", "trainer=smoke")
    assert (cfg.trainer.max_steps, cfg.trainer.epochs, cfg.trainer.eval_every) == (20, None, 10)
    assert cfg.trainer.eval_batch_size == 8  # a key smoke does not set stays the preset's
    cfg = checked("experiment=nyuv2_segnet_mtan", "trainer=smoke", "trainer.max_steps=4")
    assert cfg.trainer.max_steps == 4


def test_a_constructors_message_names_the_full_key(tmp_path):
    result = run_cli("train", "optim.lr=-1", f"hydra.run.dir={tmp_path / 'run'}", *SMOKE)
    assert result.returncode == 2
    assert result.stderr.strip() == "mtl-bench: error: optim.lr: Invalid learning rate: -1"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["balancers=uw"], "mtl-bench: error: balancers: no such key (did you mean balancer?); keys of the config:"),
        (["balancer=gradnrom"], "mtl-bench: error: balancer=gradnrom: no such option (did you mean gradnorm?)"),
    ],
)
def test_misspelled_groups_and_options_suggest_the_closest(tmp_path, args, expected):
    result = run_cli("train", *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and result.stderr.startswith(expected), result.stderr


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["balancer=gradnorm", "balancer.alpa=1"],
            "balancer.alpa: no such key (did you mean balancer.alpha?); keys of balancer: alpha, lr, grad_source,",
        ),
        (
            ["model/arch=mmoe", "model.arch.num_expert=3"],
            "model.arch.num_expert: no such key (did you mean model.arch.num_experts?); keys of model.arch: "
            "num_experts",
        ),
        (
            ["-m", "optim/schedule=step", "optim.schedule.stepsize=3", "seed=0,1"],
            "optim.schedule.stepsize: no such key (did you mean optim.schedule.step_size?)",
        ),
        # an option of the class that its YAML does not set: the plus is the right advice
        (
            ["optim.amsgrad=true"],
            "optim.amsgrad: not set by the optim option's YAML; add it with a plus: +optim.amsgrad=",
        ),
    ],
)
def test_misspelled_keys_of_every_part_suggest_the_closest(tmp_path, args, expected):
    result = run_cli("train", *args, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert result.returncode == 2 and result.stderr.startswith(f"mtl-bench: error: {expected}"), result.stderr
    assert "+balancer.alpa" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_key_added_with_a_plus_gets_the_closest_option_too(checked):
    with pytest.raises(ConfigError) as err:
        checked("balancer=gradnorm", "+balancer.alpa=1")
    assert str(err.value).startswith(
        "balancer.alpa: not an option of mtl_bench.balancers.GradNorm (did you mean balancer.alpha?); options: alpha,"
    )


def test_a_list_where_a_mapping_by_task_is_wanted_is_shown_as_that_mapping(checked):
    with pytest.raises(ConfigError) as err:
        checked("balancer.weights=[1,100]")
    assert "got [1, 100]; give it by task name: 'balancer.weights={t0: 1, t1: 100}'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        checked("optim.lr=[1,100]")  # a number is wanted: no mapping to suggest
    assert str(err.value) == "optim.lr: expected float | torch.Tensor, got [1, 100]"


def test_schedule_lengths_in_epochs_and_percent_follow_the_run():
    assert to_steps("step_size", "2 epochs", steps_per_epoch=16) == 32
    assert to_steps("step_size", "1.5ep", steps_per_epoch=10) == 15
    assert to_steps("step_size", "50%", total_steps=300) == 150
    assert to_steps("step_size", 7) == 7
    with pytest.raises(ValueError, match="step_size: must be steps, '<n> epochs' or '<p>%'"):
        to_steps("step_size", "two epochs")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    assert StepDecay(optimizer, step_size="100 epochs", steps_per_epoch=397).step_size == 39700
    assert MultiStep(optimizer, milestones=["50%", "75%"], total_steps=200).milestones == [100, 150]


@pytest.mark.parametrize("balancer, name", [("modo", "MoDo"), ("sdmgrad", "SDMGrad")])
def test_a_balancer_that_needs_micro_batches_gets_them_without_another_key(tmp_path, balancer, name):
    """`balancer=sdmgrad` trains as typed: the balancer's 3 micro-batches, said in one log line."""
    result = run_cli("train", f"balancer={balancer}", f"hydra.run.dir={tmp_path / 'run'}", *SMOKE)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "trainer.grad_accumulation_steps=3" in line]
    assert len(said) == 1 and f"{name} takes 3 micro-batches per optimizer step" in said[0]
    assert "(set by the balancer, as trainer.grad_accumulation_steps was not given)" in said[0]


def test_a_users_explicit_incompatible_accumulation_is_refused_in_one_line(tmp_path):
    args = ("train", "balancer=modo", "trainer.grad_accumulation_steps=1", f"hydra.run.dir={tmp_path / 'run'}")
    result = run_cli(*args, *SMOKE)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "mtl-bench: error: trainer.grad_accumulation_steps=1: MoDo needs 2 or 3 micro-batches per step "
        "(its independent draws)"
    )


def test_other_balancers_take_one_micro_batch_when_none_is_given(compose_cfg):
    from mtl_bench.engine.compose import build_parts

    cfg = compose_cfg("balancer=upgrad")
    conf = OmegaConf.to_object(cfg.trainer)
    assert conf.grad_accumulation_steps is None
    build_parts(cfg, conf, torch.device("cpu"))
    assert conf.grad_accumulation_steps == 1


def test_a_typed_key_the_replaced_class_does_not_take_is_refused(checked):
    """model._target_ drops the option's own keys (its default arch), never a key typed with it."""
    cfg = checked("model._target_=mtl_bench.models.SegNet", "tasks=digits")
    assert "arch" not in cfg.model
    with pytest.raises(ConfigError, match=r"^model.arch: not an option of mtl_bench.models.SegNet; options: "):
        checked("model._target_=mtl_bench.models.SegNet", "tasks=digits", "model/arch=mmoe")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["trainer.validation_holdout=0.2"],
            "trainer.validation_holdout: read only by a balancer that draws validation batches (a bilevel method, "
            "kind bilevel in docs/methods.md); FixedWeights draws none",
        ),
        (
            ["balancer=auto_lambda", "trainer.validation_source=val", "trainer.validation_holdout=0.2"],
            "trainer.validation_holdout: read only with trainer.validation_source=holdout, not val",
        ),
    ],
)
def test_validation_stream_keys_are_used_or_refused(checked, overrides, expected):
    with pytest.raises(ConfigError) as err:
        checked(*overrides)
    assert str(err.value) == expected
    checked("balancer=auto_lambda", "trainer.validation_source=holdout", "trainer.validation_holdout=0.2")  # read


def test_a_bilevel_balancer_on_a_too_small_holdout_stops_in_one_line(tmp_path):
    result = run_cli(
        "train", "balancer=auto_lambda", "trainer.validation_holdout=0.05", f"hydra.run.dir={tmp_path}", *SMOKE
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "mtl-bench: error: trainer.validation_source=holdout: trainer.validation_holdout=0.05 has 26 samples, fewer "
        "than trainer.batch_size=32 (a validation batch is as large as a training batch)"
    )


def test_intervals_in_epochs_and_percent_become_steps(checked):
    from mtl_bench.engine.compose import build_parts
    from mtl_bench.engine.step import optimizer_steps_per_epoch, samples_per_epoch

    cfg = checked(
        "trainer.max_steps=40", "trainer.eval_every=1 epoch", "trainer.log_every=25%", "trainer.checkpoint_every=2ep"
    )
    conf = OmegaConf.to_object(cfg.trainer)
    parts = build_parts(cfg, conf, torch.device("cpu"))
    per_epoch = optimizer_steps_per_epoch(conf, samples_per_epoch(parts.taskset), 1)
    assert per_epoch > 1
    assert (parts.every.eval, parts.every.log, parts.every.checkpoint) == (per_epoch, 10, 2 * per_epoch)


def test_an_interval_of_no_steps_stops_in_one_line(tmp_path):
    result = run_cli("train", "trainer.eval_every=0.001 epochs", f"hydra.run.dir={tmp_path}", *SMOKE)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("mtl-bench: error: trainer.eval_every='0.001 epochs' is 0 steps here (")
