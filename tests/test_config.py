"""Every config option composes and validates; bad values fail with one clear ConfigError line."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from mtl_bench.catalog import config_options
from mtl_bench.config import GROUP_SCHEMAS, RunConf
from mtl_bench.errors import ConfigError

OPTIONS = [(group, option) for group, options in config_options().items() for option in options]


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_every_option_composes_into_typed_objects(compose_cfg, group, option):
    conf = OmegaConf.to_object(compose_cfg(f"{group}={option}"))
    assert isinstance(conf, RunConf)
    if group in GROUP_SCHEMAS:
        # the YAML extends the schema its `name` selects, so the node is that dataclass
        node = getattr(conf, group)
        assert isinstance(node, GROUP_SCHEMAS[group][node.name])


def test_every_schema_has_a_yaml():
    options = config_options()
    for group, schemas in GROUP_SCHEMAS.items():
        assert set(schemas) <= set(options[group]), group


def test_wrong_type_fails_at_compose_time(compose_cfg):
    with pytest.raises(ConfigCompositionException, match="optim.lr"):
        compose_cfg("optim.lr=abc")


def test_unknown_key_fails_at_compose_time(compose_cfg):
    with pytest.raises(ConfigCompositionException, match="lrr"):
        compose_cfg("optim.lrr=0.1")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr=-0.1", "optim.lr=-0.1 is not allowed: must be > 0"),
        ("optim.schedule.name=exp", "optim.schedule.name='exp' is not allowed: allowed: none, step, multistep, cosine, eden, eden2, cyclic"),
        ("trainer.batch_size=0", "trainer.batch_size=0 is not allowed: must be > 0"),
        ("trainer.device=tpu", "trainer.device='tpu' is not allowed: auto, cpu, cuda or cuda:N"),
        ("model.activation=swish", "model.activation='swish' is not allowed: allowed: relu, tanh, gelu"),
        ("balancer.weights={t0:-1.0,t1:1.0}", "balancer.weights.t0=-1.0 is not allowed: must be >= 0"),
        ("balancer.weights={t0:abc}", "balancer.weights.t0='abc' is not allowed: a number"),
    ],
)
def test_bad_values_raise_one_line_config_error(compose_cfg, override, message):
    with pytest.raises(ConfigError) as info:
        OmegaConf.to_object(compose_cfg(override))
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_gradnorm_theoretical_initial_losses_need_every_task_to_declare_one(compose_cfg):
    from mtl_bench.engine.builders import build_balancer, build_model, build_taskset

    conf = OmegaConf.to_object(compose_cfg("tasks=digits", "model=lenet", "tasks.n_train=16", "tasks.n_val=8",
                                           "tasks.n_test=8", "balancer=gradnorm",
                                           "balancer.initial_losses=theoretical"))
    taskset = build_taskset(conf.tasks)
    with pytest.raises(ConfigError, match=r"tasks \['sum'\] declare no theoretical initial loss"):
        build_balancer(conf.balancer, taskset.tasks, build_model(conf.model, taskset))


def test_custom_optimizer_kwargs_and_paramwise_take_a_mapping_override(compose_cfg):
    conf = OmegaConf.to_object(compose_cfg("optim=custom", "optim.kwargs={alpha:0.9}",
                                           "optim.paramwise={custom_keys:{heads:{lr_mult:10.0}}}"))
    assert conf.optim.kwargs == {"alpha": 0.9}
    assert conf.optim.paramwise == {"custom_keys": {"heads": {"lr_mult": 10.0}}}


def test_task_set_reference_values_are_checked(compose_cfg):
    from mtl_bench.engine.builders import build_taskset

    conf = OmegaConf.to_object(compose_cfg("tasks.n_train=64", "tasks.n_val=8", "tasks.n_test=8",
                                           "tasks.reference={t0: {mse: 0.3}, t1: {mse: 2500}}"))
    assert conf.tasks.reference == {"t0": {"mse": 0.3}, "t1": {"mse": 2500}}
    build_taskset(conf.tasks)  # names the toy's tasks and metrics: accepted
    with pytest.raises(ConfigError, match="tasks.reference=.* is not allowed: null or {task: {metric: number}}"):
        OmegaConf.to_object(compose_cfg("tasks.reference={t0: 0.3}"))
    for reference, message in (("{t7: {mse: 1.0}}", "tasks.reference.t7: no such task; tasks: t0, t1"),
                               ("{t0: {acc: 1.0}}", "tasks.reference.t0.acc: no such metric; metrics: loss, mse")):
        conf = OmegaConf.to_object(compose_cfg("tasks.n_train=64", "tasks.n_val=8", "tasks.n_test=8",
                                               f"tasks.reference={reference}"))
        with pytest.raises(ConfigError, match=message):
            build_taskset(conf.tasks)
