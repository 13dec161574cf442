"""trainer.compile: the compiled forward trains to the same parameters as the eager one, every
balancer still gets its gradients at the shared representation and the last shared layer, and a compiler
that fails leaves an eager run and one warning line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch._dynamo.utils import counters

from mtl_bench.balancers import Balancer
from mtl_bench.balancers.base import BUILD_ARGUMENTS
from mtl_bench.config import ENGINE_KEYS
from mtl_bench.engine.builders import build
from mtl_bench.engine.compile import CompiledForward, compile_mode, maybe_compile
from mtl_bench.engine.precision import Precision
from mtl_bench.engine.step import StepRunner
from mtl_bench.models import MLP, LeNet, MultiTaskModel
from mtl_bench.tasks import TaskSet

SMALL = ["trainer=smoke", "tasks.n_train=512", "tasks.n_val=64", "tasks.n_test=64"]
STEPS = 3


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: dynamo keeps compiled code per code object, and past its recompile limit
    (8 per code object, e.g. Sequential.forward) it runs the frame eagerly without a word to us."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def parts(cfg):
    """Task set, model and balancer built as the recipe builds them (seeded the same each call)."""
    torch.manual_seed(0)
    taskset = build("tasks", cfg.tasks, TaskSet)
    model = build(
        "model",
        cfg.model,
        MultiTaskModel,
        input_shape=taskset.input_shape,
        heads={t.name: t.out_dim for t in taskset.tasks},
    )
    supplied = {
        "task_names": taskset.task_names,
        "shared_params": list(model.shared_parameters()),
        "shared_layer": model.last_shared_layer,
        "world_size": 1,
        "initial_losses_known": {t.name: t.initial_loss for t in taskset.tasks},
    }
    assert set(supplied) == set(BUILD_ARGUMENTS)
    balancer = build("balancer", cfg.balancer, Balancer, ignore=ENGINE_KEYS.get("balancer", ()), **supplied)
    return taskset, model, balancer


def train_steps(cfg, compile_setting) -> tuple[MultiTaskModel, Balancer, list[dict[str, torch.Tensor]]]:
    """STEPS optimizer steps of the engine's StepRunner with SGD, the forward compiled or not."""
    taskset, model, balancer = parts(cfg)
    conf = OmegaConf.to_object(cfg.trainer)
    forward = maybe_compile(model, compile_setting)
    runner = StepRunner(forward, taskset, balancer, Precision(torch.device("cpu")), conf, cfg.seed, torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    measured = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        result = runner.run(step)
        optimizer.step()
        measured.append(result.measurements | balancer.step(False))
    if compile_setting:
        assert isinstance(forward, CompiledForward) and forward.compiled, "the compiled path did not run"
        assert counters["stats"]["unique_graphs"] >= 1, "dynamo compiled no graph"
    return model, balancer, measured


def assert_same_training(cfg) -> None:
    eager_model, eager_balancer, eager_measured = train_steps(cfg, False)
    model, balancer, measured = train_steps(cfg, True)
    # float32: the compiler fuses and reorders arithmetic, so the last bits may differ
    for (name, p), q in zip(eager_model.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    for key, value in eager_balancer.state_dict().items():
        torch.testing.assert_close(balancer.state_dict()[key], value, rtol=1e-4, atol=1e-5)
    for eager_step, step in zip(eager_measured, measured):
        assert eager_step.keys() == step.keys()
        for key in eager_step:
            torch.testing.assert_close(step[key], eager_step[key], rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")


# ----------------------------------------------------------------------------- same numbers compiled or not


def test_gradnorm_at_the_hooked_last_shared_linear_trains_the_same_compiled(compose_cfg):
    """GradNorm's default measures at the last shared nn.Linear through a forward hook: the layer must run
    eagerly so that the hook sees its output and a gradient at that output exists."""
    assert_same_training(compose_cfg(*SMALL, "model.widths=[32,32,32]", "balancer=gradnorm"))


def test_a_balancer_at_the_shared_representation_trains_the_same_compiled(compose_cfg):
    assert_same_training(
        compose_cfg(*SMALL, "model.widths=[32,32,32]", "balancer=imtl", "balancer.grad_source=shared_rep")
    )


def test_a_batched_jacobian_through_the_compiled_trunk_trains_the_same(compose_cfg):
    """UPGrad takes the T task gradients at the shared parameters in one batched (vmap) product through the
    trunk; inductor's kernels cannot read vmap's tensors, so that backward runs the graph eagerly."""
    assert_same_training(compose_cfg(*SMALL, "model.widths=[32,32,32]", "balancer=upgrad"))


@pytest.mark.slow
def test_lenet_with_per_task_steps_trains_the_same_compiled(compose_cfg):
    assert_same_training(
        compose_cfg(
            *SMALL,
            "experiment=digits_lenet",
            "tasks.n_train=512",
            "tasks.n_val=64",
            "tasks.n_test=64",
            "balancer=gradnorm",
            "trainer.step_mode=per_task",
        )
    )


@pytest.mark.slow
def test_lenet_gradients_at_the_shared_parameters_are_the_same_compiled(compose_cfg):
    assert_same_training(
        compose_cfg(
            *SMALL, "experiment=digits_lenet", "tasks.n_train=512", "tasks.n_val=64", "tasks.n_test=64", "balancer=mgda"
        )
    )


BALANCERS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "balancer").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("balancer", BALANCERS)
def test_every_balancer_trains_the_same_compiled(compose_cfg, balancer):
    if balancer == "nash_mtl":
        pytest.importorskip("cvxpy")  # Nash-MTL's solver (the peers extra), as tests/balancers/test_zoo.py
    assert_same_training(compose_cfg(*SMALL, "model.widths=[32,32,32]", f"balancer={balancer}"))


# ----------------------------------------------------------------------------- settings, structure, fallback


@pytest.mark.parametrize(
    "setting, mode",
    [
        (False, None),
        (None, None),
        ("false", None),
        (True, "default"),
        ("true", "default"),
        ("default", "default"),
        ("reduce-overhead", "reduce-overhead"),
        ("max-autotune", "max-autotune"),
        ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs"),
    ],
)
def test_settings(setting, mode):
    assert compile_mode(setting) == mode


@pytest.mark.parametrize("setting", ["fast", "yes", 1, 0])
def test_a_bad_setting_names_the_key_and_the_allowed_values(setting):
    with pytest.raises(ValueError, match=r"trainer.compile: must be false, true or one of default, reduce-overhead"):
        compile_mode(setting)


def test_off_returns_the_model_itself():
    model = MLP((4,), {"a": 1})
    assert maybe_compile(model, False) is model and maybe_compile(model, "false") is model


def test_the_compiled_region_ends_before_the_last_shared_layer_and_keeps_the_model_whole():
    model = LeNet((1, 8, 12), {"a": 10, "b": 1})
    forward = maybe_compile(model, True)
    region = forward.__dict__["_region"]
    assert not any(m is model.last_shared_layer for m in region.modules())
    assert [id(p) for p in forward.parameters()] == [id(p) for p in model.parameters()]
    assert list(forward.model.state_dict()) == list(model.state_dict())  # checkpoints keep their keys
    forward.eval()
    assert not model.training


def failing_backend(gm, example_inputs):
    raise RuntimeError("no C++ compiler found\nsecond line")


@pytest.fixture
def compiler_fails(monkeypatch):
    """torch.compile as the module calls it, with a backend that fails at the first call (as inductor does
    without a working C++ compiler)."""
    real = torch.compile

    def compile_failing(module, mode=None, **kwargs):
        return real(module, backend=failing_backend)

    monkeypatch.setattr(torch, "compile", compile_failing)


def test_a_failing_compiler_falls_back_to_eager_with_one_warning(compiler_fails, caplog):
    torch.manual_seed(0)
    model = MLP((6,), {"a": 2, "b": 3}, widths=(8, 8))
    forward = maybe_compile(model, True)
    x = torch.randn(5, 6)
    with caplog.at_level(logging.WARNING, logger="mtl_bench"):
        first = forward(x)
        second = forward(x, tasks=["b"])
    eager = model(x)
    torch.testing.assert_close(first.shared, eager.shared, rtol=0, atol=0)
    torch.testing.assert_close(second.preds["b"], eager.preds["b"], rtol=0, atol=0)
    assert list(second.preds) == ["b"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "torch.compile failed" in message and "no C++ compiler found" in message and "\n" not in message
    assert not forward.compiled


def test_a_failing_compiler_still_trains_the_same_as_eager(compiler_fails, compose_cfg, caplog):
    cfg = compose_cfg(*SMALL, "model.widths=[16,16]", "balancer=gradnorm")
    eager_model, _, _ = train_steps(cfg, False)
    taskset, model, balancer = parts(cfg)
    forward = maybe_compile(model, "max-autotune")
    runner = StepRunner(
        forward,
        taskset,
        balancer,
        Precision(torch.device("cpu")),
        OmegaConf.to_object(cfg.trainer),
        cfg.seed,
        torch.device("cpu"),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with caplog.at_level(logging.WARNING, logger="mtl_bench"):
        for step in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            runner.run(step)
            optimizer.step()
            balancer.step(False)
    for p, q in zip(eager_model.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0)
    assert sum("torch.compile failed" in r.getMessage() for r in caplog.records) == 1


def test_a_backward_inductor_cannot_compile_runs_its_graph_eagerly(monkeypatch, compose_cfg, caplog):
    import mtl_bench.engine.compile as compile_module

    real = compile_module.compile_graph

    def forward_only(gm, example_inputs, options, backward):
        if backward:
            raise RuntimeError("backward kernel rejected")
        return real(gm, example_inputs, options, backward)

    monkeypatch.setattr(compile_module, "compile_graph", forward_only)
    with caplog.at_level(logging.WARNING, logger="mtl_bench"):
        assert_same_training(compose_cfg(*SMALL, "model.widths=[16,16]", "balancer=gradnorm"))
    failures = [r.getMessage() for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert len(failures) == 1 and "backward kernel rejected" in failures[0]


def test_torch_compile_refusing_at_once_leaves_an_eager_model(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise RuntimeError("Dynamo is not supported on this Python")

    monkeypatch.setattr(torch, "compile", refuse)
    model = MLP((4,), {"a": 1})
    with caplog.at_level(logging.WARNING, logger="mtl_bench"):
        forward = maybe_compile(model, True)
    assert not forward.compiled and "Dynamo is not supported" in caplog.text
    x = torch.randn(2, 4)
    torch.testing.assert_close(forward(x).preds["a"], model(x).preds["a"], rtol=0, atol=0)


def test_an_input_error_is_the_eager_error_not_a_fallback(caplog):
    forward = maybe_compile(MLP((4,), {"a": 1}, widths=(3, 3)), True)
    with caplog.at_level(logging.WARNING, logger="mtl_bench"), pytest.raises(RuntimeError, match="shapes"):
        forward(torch.randn(2, 5))
    assert "torch.compile failed" not in caplog.text


def test_a_model_with_its_own_forward_runs_eagerly_with_a_warning(caplog):
    class Custom(MLP):
        def forward(self, x, tasks=None):
            return super().forward(x * 2, tasks)

    model = Custom((4,), {"a": 1})
    with caplog.at_level(logging.WARNING, logger="mtl_bench"):
        forward = maybe_compile(model, True)
    assert "defines its own forward" in caplog.text and not forward.compiled
    x = torch.randn(2, 4)
    torch.testing.assert_close(forward(x).preds["a"], model(x).preds["a"], rtol=0, atol=0)


# ----------------------------------------------------------------------------- through the recipe


def test_recipe_trains_the_same_with_trainer_compile(compose_cfg, tmp_path: Path):
    from mtl_bench.engine.recipe import train

    common = [*SMALL, "model.widths=[32,32]", "balancer=gradnorm", "trainer.max_steps=4", "trainer.eval_every=4"]
    eager = train(compose_cfg(*common, "trainer.compile=false"), tmp_path / "eager")
    compiled = train(compose_cfg(*common, "trainer.compile=true"), tmp_path / "compiled")
    for task, metrics in eager.test.items():
        for name, value in metrics.items():
            assert compiled.test[task][name] == pytest.approx(value, rel=1e-4, abs=1e-6)


# ----------------------------------------------------------------------------- DDP (2 CPU processes, gloo)


def ddp_worker(rank: int, world: int, port: int, conf, run_dir: str) -> None:
    """A rank of a run: Recipe.setup wraps DDP(maybe_compile(model, trainer.compile))."""
    from tests.helpers.processes import join_torchrun_env

    join_torchrun_env(rank, world, port)
    from mtl_bench.engine import recipe

    recipe.train(conf, Path(run_dir) if rank == 0 else Path(run_dir).with_name("ignored"))


@pytest.mark.slow
@pytest.mark.parametrize("mode, balancer", [("joint", "upgrad"), ("per_task", "gradnorm")])
def test_compiled_ddp_trains_the_same_as_eager_ddp(compose_cfg, tmp_path, mode, balancer):
    from tests.helpers.processes import free_port, spawn_and_wait

    for setting in (False, True):
        conf = compose_cfg(
            *SMALL,
            "model.widths=[32,32]",
            "optim=sgd",
            f"trainer.step_mode={mode}",
            f"balancer={balancer}",
            "trainer.batch_size=16",
            "trainer.num_threads=1",
            f"trainer.compile={setting}",
        )
        spawn_and_wait(
            ddp_worker,
            (2, free_port(), conf, str(tmp_path / f"ddp_{setting}")),
            nprocs=2,
            timeout_s=300,
            what="DDP workers did not finish",
        )
    a, b = (torch.load(tmp_path / f"ddp_{s}" / "checkpoints" / "last.pt", weights_only=True) for s in (True, False))
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5)
    for key in a["balancer"]:
        torch.testing.assert_close(a["balancer"][key], b["balancer"][key], rtol=1e-4, atol=1e-5)
