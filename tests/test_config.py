"""Every YAML under conf/ names a class whose signature takes its keys; bad values are one line naming the key."""

from __future__ import annotations

import typing

import pytest
from omegaconf import DictConfig, OmegaConf

from mtl_bench.catalog import conf_root, config_options
from mtl_bench.config import ENGINE_KEYS
from mtl_bench.engine.builders import SUPPLIED, build, check_part, node_dict, parameters, target_of
from mtl_bench.engine.compose import finalise_config
from mtl_bench.errors import ConfigError
from tests.helpers.cli import run_cli

OPTIONS = [(group, option) for group, options in config_options().items() for option in options]


def test_every_yaml_under_conf_is_an_option_the_test_below_composes():
    root = conf_root()
    on_disk = {
        str(p.relative_to(root).with_suffix(""))
        for p in root.rglob("*.yaml")
        if p.parent != root and p.relative_to(root).parts[0] not in ("hydra", "study")  # study: tests/study
    }
    listed = {f"{group}/{option}" for group, option in OPTIONS}
    assert on_disk == listed


def single_valued(parameter) -> bool:
    """A parameter with one legal value (`Literal["shared_params"]`) would be a key nobody needs to type."""
    return typing.get_origin(parameter.annotation) is typing.Literal and len(typing.get_args(parameter.annotation)) == 1


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_every_option_keys_match_the_signature_of_its_class(compose_cfg, group, option):
    """Each part's keys are parameters of its `_target_` with values of their types, and every option of the
    signature (what the engine does not supply) is in the YAML, so `--cfg job` shows it and overrides need no +."""
    cfg = compose_cfg(f"{group}={option}")
    for key, supplied in SUPPLIED.items():
        if OmegaConf.select(cfg, key) is None and key in ("model.arch", "model.front"):
            continue  # a model without architectures (SegNet, MPNN), a model without a front
        node = node_dict(OmegaConf.select(cfg, key))
        target = check_part(key, node, supplied, ENGINE_KEYS.get(key, ()))
        if not node["_target_"].startswith("mtl_bench."):
            continue  # torch's classes: the YAML lists the options it sets, not all of them
        options = {
            name
            for name, p in parameters(target).items()
            if name not in supplied and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }
        assert options <= set(node), (key, sorted(options - set(node)))
        assert not [name for name in options if single_valued(parameters(target)[name])], key
    finalise_config(cfg, [])


def test_own_classes_document_each_argument():
    """The constructor is the one declaration of an option: each argument has its line in the docstring."""
    root = conf_root()
    for path in root.rglob("*.yaml"):
        node = OmegaConf.load(path)
        if not isinstance(node, DictConfig) or not str(node.get("_target_", "")).startswith("mtl_bench."):
            continue
        target = target_of(str(path), {"_target_": str(node["_target_"])})
        doc = (getattr(target, "__init__").__doc__ or "") + (target.__doc__ or "")
        for name in parameters(target):
            assert name == "params" or f"{name}:" in doc, (path.name, name)  # params: torch.optim's convention


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.lr=abc"], "optim.lr: expected float | torch.Tensor, got 'abc'"),
        (
            ["+balancer.nonsense=1"],
            "balancer.nonsense: not an option of mtl_bench.balancers.FixedWeights; options: weights",
        ),
        (["model._target_=no.such.Class"], "model._target_: cannot import 'no.such.Class' (No module named 'no')"),
        (["model.widths=abc"], "model.widths: expected Sequence[int], got 'abc'"),
        (
            ["optim/schedule=cosine", "+optim.schedule.total_steps=5"],
            "optim.schedule.total_steps: given by the engine at build time, not a config option",
        ),
        (
            ["model._target_=torch.nn.Linear"],
            "model.in_features: torch.nn.Linear needs it; add +model.in_features=<value>",
        ),
    ],
)
def test_bad_keys_and_types_fail_before_anything_is_built(compose_cfg, overrides, message):
    with pytest.raises(ConfigError) as info:
        finalise_config(compose_cfg(*overrides), overrides)
    assert str(info.value) == message


# The gradient methods with one gradient source have no grad_source key: typed, it is an unknown key.
ONE_SOURCE = ["db_mtl", "excess_mtl", "graddrop", "moco", "modo", "sdmgrad", "trimmed_mean", "pcgrad", "upgrad"]


@pytest.mark.parametrize("balancer", ONE_SOURCE)
def test_a_method_with_one_gradient_source_refuses_grad_source(compose_cfg, balancer):
    overrides = [f"balancer={balancer}", "+balancer.grad_source=shared_params"]
    with pytest.raises(ConfigError) as info:
        finalise_config(compose_cfg(*overrides), overrides)
    assert str(info.value).startswith("balancer.grad_source: not an option of mtl_bench.balancers.")


def test_grad_source_typed_for_a_method_with_one_source_is_no_such_key():
    result = run_cli("train", "balancer=db_mtl", "balancer.grad_source=shared_params")
    assert result.returncode == 2
    assert (
        result.stderr
        == "mtl-bench: error: balancer.grad_source: no such key; keys of balancer: beta, beta_sigma, eps\n"
    )


@pytest.mark.parametrize(
    ("key", "override", "message"),
    [
        ("balancer", "balancer.alpha=-1", "balancer.alpha: must be a number >= 0, got -1"),
        (
            "balancer",
            "balancer.grad_source=trunk",
            "balancer.grad_source: 'trunk' is not one of last_shared, shared_rep",
        ),
        ("model", "model.activation=swish", "model.activation: 'swish' is not one of relu, tanh, gelu"),
        ("precision", "precision.loss_scale=auto", "precision.loss_scale: must be dynamic, a number > 0"),
        ("optim.schedule", "optim.schedule.min_lr_ratio=2", "optim.schedule.min_lr_ratio: must be in 0..1, got 2"),
    ],
)
def test_value_checks_live_in_the_classes_and_name_the_key(compose_cfg, key, override, message):
    group = {
        "balancer": "balancer=gradnorm",
        "precision": "precision=fp16",
        "optim.schedule": "optim/schedule=cosine",
        "model": "model=mlp",
    }[key]
    cfg = compose_cfg(group, override)
    supplied = {
        "model": {"input_shape": (3,), "heads": {"a": 1}},
        "precision": {"device": "cpu"},
        "balancer": {"task_names": ["a"], "shared_layer": __import__("torch").nn.Linear(2, 2)},
        "optim.schedule": {
            "optimizer": __import__("torch").optim.SGD([__import__("torch").zeros(1, requires_grad=True)], lr=1.0),
            "total_steps": 10,
        },
    }[key]
    with pytest.raises(ConfigError) as info:
        build(key, OmegaConf.select(cfg, key), None, ignore=ENGINE_KEYS.get(key, ()), **supplied)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_a_replaced_target_drops_the_options_own_keys_but_not_the_command_lines(compose_cfg):
    overrides = ["model._target_=mtl_bench.models.LeNet", "+model.hidden=7"]
    cfg = compose_cfg(*overrides)
    finalise_config(cfg, overrides)
    assert set(cfg.model) == {"_target_", "hidden", "arch"}  # LeNet takes an architecture too


def test_trainer_values_are_checked(compose_cfg):
    with pytest.raises(ConfigError, match=r"trainer.batch_size=0 is not allowed: must be > 0"):
        OmegaConf.to_object(compose_cfg("trainer.batch_size=0").trainer)


def test_task_set_reference_values_are_checked(compose_cfg):
    cfg = compose_cfg("tasks.n_train=16", "tasks.n_val=8", "tasks.n_test=8", "+tasks.reference={t9:{mse:1.0}}")
    with pytest.raises(ConfigError, match=r"tasks.reference.t9: no such task; tasks: t0, t1"):
        build("tasks", cfg.tasks)
