"""trainer.compile: the compiled forward trains to the same parameters as the eager one, every
balancer still gets its gradients at the shared representation and the last shared layer, and a compiler
that fails stops the run with one line saying why (never an eager run in its place)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch._dynamo.utils import counters

from mtl_bench.balancers import Balancer
from mtl_bench.config import ENGINE_KEYS
from mtl_bench.engine.builders import build, node_dict, target_of
from mtl_bench.engine.compile import CompiledForward, CompileError, compile_mode, implementation_of, maybe_compile
from mtl_bench.engine.compose import validation_for
from mtl_bench.engine.precision import Precision
from mtl_bench.engine.step import StepRunner
from mtl_bench.gradient_engine.balancer import BUILD_ARGUMENTS
from mtl_bench.models import MLP, LeNet, MultiTaskModel
from mtl_bench.tasks import TaskSet

SMALL = ["trainer=smoke", "tasks.n_train=512", "tasks.n_val=64", "tasks.n_test=64"]
STEPS = 3


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: dynamo keeps compiled code per code object, and past its recompile limit
    (8 per code object, e.g. Sequential.forward) it runs the frame eagerly without a word to us."""
    torch.compiler.reset()
    counters.clear()
    yield
    torch.compiler.reset()


def parts(cfg):
    """Task set, model, balancer and its validation stream (a bilevel one's, else None) built as the recipe builds
    them (seeded the same each call)."""
    torch.manual_seed(0)
    taskset = build("tasks", cfg.tasks, TaskSet)
    model = build(
        "model",
        cfg.model,
        MultiTaskModel,
        input_shape=taskset.input_shape,
        heads={t.name: t.out_dim for t in taskset.tasks},
    )
    conf = OmegaConf.to_object(cfg.trainer)
    validation = validation_for(target_of("balancer", node_dict(cfg.balancer)), conf, taskset, cfg.seed)  # auto_lambda
    supplied = {
        "task_names": taskset.task_names,
        "shared_params": list(model.shared_parameters()),
        "shared_layer": model.last_shared_layer,
        "world_size": 1,
        "initial_losses_known": {t.name: t.initial_loss for t in taskset.tasks},
        "validation": validation,
    }
    assert set(supplied) == set(BUILD_ARGUMENTS)
    balancer = build("balancer", cfg.balancer, Balancer, ignore=ENGINE_KEYS.get("balancer", ()), **supplied)
    return taskset, model, balancer, validation


def train_steps(cfg, compile_setting) -> tuple[MultiTaskModel, Balancer, list[dict[str, torch.Tensor]]]:
    """STEPS optimizer steps of the engine's StepRunner with SGD, the forward compiled or not."""
    taskset, model, balancer, validation = parts(cfg)
    conf = OmegaConf.to_object(cfg.trainer)
    forward = maybe_compile(model, compile_setting)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    runner = StepRunner(
        forward,
        taskset,
        balancer,
        Precision(torch.device("cpu")),
        conf,
        cfg.seed,
        torch.device("cpu"),
    )
    if validation is not None:
        validation.connect(runner, optimizer)  # as the loop does at set-up
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
    """UPGrad takes the T task gradients at the shared parameters with T backwards through the compiled trunk
    (the zoo's methods no longer use a batched vmap product; the backward's eager path for batched gradients
    stays for a user's balancer that does)."""
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
    # MoDo and SDMGrad draw their independent batches from the micro-batches of one step
    extra = ["trainer.grad_accumulation_steps=3"] if balancer in ("modo", "sdmgrad") else []
    if balancer in ("krum", "trimmed_mean"):  # robust aggregation needs more than two tasks
        extra.append("tasks=toy10")
    assert_same_training(compose_cfg(*SMALL, "model.widths=[32,32,32]", f"balancer={balancer}", *extra))


# ----------------------------------------------------------------------------- settings, structure, failures


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


def one_line(err: pytest.ExceptionInfo[CompileError], *parts: str) -> None:
    message = str(err.value)
    assert message.startswith("trainer.compile=") and "\n" not in message, message
    for part in parts:
        assert part in message, message


def test_a_failing_compiler_stops_with_one_line(compiler_fails):
    torch.manual_seed(0)
    model = MLP((6,), {"a": 2, "b": 3}, widths=(8, 8))
    forward = maybe_compile(model, True)
    with pytest.raises(CompileError) as err:
        forward(torch.randn(5, 6))
    one_line(err, "torch.compile failed on the forward", "no C++ compiler found", "set trainer.compile=false")


def test_a_failing_compiler_stops_the_training_step(compiler_fails, compose_cfg):
    cfg = compose_cfg(*SMALL, "model.widths=[16,16]", "balancer=gradnorm")
    taskset, model, balancer, _ = parts(cfg)
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
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(CompileError) as err:
        runner.run(0)
    one_line(err, "trainer.compile=max-autotune", "no C++ compiler found")
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_a_backward_inductor_cannot_compile_stops_with_one_line(monkeypatch, compose_cfg):
    import mtl_bench.engine.compile as compile_module

    real = compile_module.compile_graph

    def forward_only(gm, example_inputs, options, backward):
        if backward:
            raise RuntimeError("backward kernel rejected")
        return real(gm, example_inputs, options, backward)

    monkeypatch.setattr(compile_module, "compile_graph", forward_only)
    with pytest.raises(CompileError) as err:
        assert_same_training(compose_cfg(*SMALL, "model.widths=[16,16]", "balancer=gradnorm"))
    one_line(err, "on the backward graph", "backward kernel rejected")


def test_torch_compile_refusing_at_once_is_an_error_at_wrap_time(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("Dynamo is not supported on this Python")

    monkeypatch.setattr(torch, "compile", refuse)
    with pytest.raises(CompileError) as err:
        maybe_compile(MLP((4,), {"a": 1}), True)
    one_line(err, "at wrap time", "Dynamo is not supported")


def test_an_input_error_is_the_eager_error_not_a_compile_error():
    forward = maybe_compile(MLP((4,), {"a": 1}, widths=(3, 3)), True)
    with pytest.raises(RuntimeError, match="shapes") as err:
        forward(torch.randn(2, 5))
    assert not isinstance(err.value, CompileError)


def test_a_model_with_its_own_forward_is_an_error():
    class Custom(MLP):
        def forward(self, x, tasks=None):
            return super().forward(x * 2, tasks)

    with pytest.raises(CompileError) as err:
        maybe_compile(Custom((4,), {"a": 1}), True)
    one_line(err, "cannot compile this model", "defines its own forward")


def test_what_runs_is_named_and_logged_once(caplog):
    model = MLP((4,), {"a": 1}, widths=(3, 3))
    assert implementation_of(maybe_compile(model, False)) == "eager"
    with caplog.at_level(logging.INFO, logger="mtl_bench"):
        forward = maybe_compile(model, "max-autotune")
    assert implementation_of(forward).startswith("torch.compile mode=max-autotune (inductor): ")
    assert [r.getMessage() for r in caplog.records] == [f"trainer.compile: {implementation_of(forward)}"]


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
