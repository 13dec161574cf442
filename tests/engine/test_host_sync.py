"""No host synchronisation in a training step on a GPU, checked on the CPU: every balancer option steps through the
engine (the loop, the GradScaler or the non-finite check, the optimizer, the balancer's commit) under the guard of
tests/helpers/host_sync.py. The only reads allowed are a method's named host solve (`HOST_SOLVE`, listed in
docs/methods.md) and reads through `cpu_value` (CPU-only paths); a method that names a host solve must have one."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.catalog import config_options
from mtl_bench.devices import cpu_value
from mtl_bench.engine.recipe import Recipe
from tests.helpers.host_sync import allowed, host_syncs, no_host_sync

BALANCERS = config_options()["balancer"]
TOY10 = ["tasks=toy10", "tasks.n_train=256", "tasks.n_val=32", "tasks.n_test=32", "model.widths=[16,16]"]
RUN = ["trainer=smoke", "trainer.batch_size=32", "trainer.num_threads=1"]
# As tests/balancers/test_zoo.py: draws on micro-batches, a validation split for the bilevel methods.
EXTRA = {"modo": ["trainer.grad_accumulation_steps=3"], "sdmgrad": ["trainer.grad_accumulation_steps=3"]}
EXTRA["auto_lambda"] = EXTRA["moml"] = EXTRA["forum"] = ["trainer.validation_holdout=0.2"]


def overrides(balancer: str, precision: str) -> list[str]:
    return [f"balancer={balancer}", f"precision={precision}", *TOY10, *RUN, *EXTRA.get(balancer, [])]


def steps_syncs(cfg, run_dir, steps: int = 2):
    """(the balancer, the host syncs of `steps` steps between log points after one warm-up step)."""
    recipe = Recipe(cfg, run_dir)
    recipe.setup()
    try:
        recipe.optimizer_step(False)  # first-step work (lazy buffers, a kernel build) is not the hot path
        recipe.step += 1
        with host_syncs() as found:
            for _ in range(steps):
                recipe.optimizer_step(False)
                recipe.step += 1
    finally:
        recipe.cleanup()
    return recipe.balancer, found


# fp16 for every method (the GradScaler's path: scaled backward, unscale, skip on the device); bf16 for three kinds.
CASES = [(b, "fp16") for b in BALANCERS] + [(b, "bf16") for b in ("fixed", "famo", "nash_mtl")]


@pytest.mark.parametrize(("balancer", "precision"), CASES)
def test_a_step_reads_the_device_only_in_a_named_host_solve(compose_cfg, tmp_path, balancer, precision):
    cfg = compose_cfg(*overrides(balancer, precision))
    bal, found = steps_syncs(cfg, tmp_path)
    unexplained = [str(s) for s in found if not allowed(s, bal)]
    assert not unexplained, f"{balancer}: host syncs outside a named host solve: {sorted(set(unexplained))}"
    if bal.HOST_SOLVE:
        assert any(not allowed(s) for s in found), f"{balancer} names a host solve ({bal.HOST_SOLVE}) it never runs"


@pytest.mark.slow
@pytest.mark.parametrize("balancer", BALANCERS)
def test_a_per_task_step_reads_the_device_only_in_a_named_host_solve(compose_cfg, tmp_path, balancer):
    """The same in trainer.step_mode=per_task (one backward per task), for the methods that have that mode."""
    from mtl_bench.errors import ConfigError

    cfg = compose_cfg(*overrides(balancer, "fp16"), "trainer.step_mode=per_task")
    try:
        bal, found = steps_syncs(cfg, tmp_path)
    except ConfigError as err:
        assert "has no per-task mode" in str(err) or "step_mode" in str(err), err
        pytest.skip(f"{balancer}: no per-task mode")
    unexplained = [str(s) for s in found if not allowed(s, bal)]
    assert not unexplained, f"{balancer}: host syncs outside a named host solve: {sorted(set(unexplained))}"


@pytest.mark.cuda
@pytest.mark.parametrize("balancer", BALANCERS)
def test_on_cuda_a_step_syncs_only_in_a_named_host_solve(compose_cfg, tmp_path, balancer):
    """The same on a GPU, by CUDA's own sync detector: steps of a method without a host solve raise on any sync
    (a method with one only warns: its solve's reads are expected)."""
    cfg = compose_cfg(*overrides(balancer, "fp16"), "trainer.device=cuda")
    recipe = Recipe(cfg, tmp_path)
    recipe.setup()
    try:
        recipe.optimizer_step(False)
        recipe.step += 1
        torch.cuda.synchronize()
        host_solve = bool(recipe.balancer.HOST_SOLVE)
        torch.cuda.set_sync_debug_mode("warn" if host_solve else "error")
        try:
            for _ in range(2):
                recipe.optimizer_step(False)
                recipe.step += 1
        finally:
            torch.cuda.set_sync_debug_mode("default")
    finally:
        recipe.cleanup()


@pytest.mark.parametrize(
    "sync",
    [
        lambda x: x.sum().item(),
        lambda x: x.tolist(),
        lambda x: float(x[0, 0]),
        lambda x: bool(x[0, 0] > 0),
        lambda x: x.numpy(),
        lambda x: x.cpu(),
        lambda x: x[x > 0],
        lambda x: x.masked_fill(x > 0, 0).nonzero(),
        lambda x: x.__setitem__(x > 0, 0.0),
        lambda x: torch.unique(x),
        lambda x: torch.equal(x, x),
        lambda x: torch.linalg.solve(x @ x.T + torch.eye(3), torch.ones(3)),
        lambda x: x[torch.tensor(1)],
    ],
)
def test_the_guard_catches_what_syncs_on_cuda(sync):
    x = torch.randn(3, 3)
    with pytest.raises(AssertionError, match="host sync in the hot path"):
        with no_host_sync():
            sync(x)


def test_the_guard_lets_device_work_and_cpu_only_reads_through():
    x = torch.randn(3, 3)
    with no_host_sync():
        torch.linalg.solve_ex(x @ x.T + torch.eye(3), torch.ones(3))
        x.masked_fill(x > 0, 0).gather(0, torch.zeros(1, 3, dtype=torch.long))
        assert cpu_value(torch.tensor(True)) is True  # a CPU-only path says so
    with pytest.raises(ValueError, match="cpu_value: a meta tensor"):
        cpu_value(torch.empty((), device="meta"))


def test_the_loop_reads_the_device_once_per_log_point_and_at_evaluations_and_checkpoints(compose_cfg, tmp_path):
    steps, log_every = 12, 4
    cfg = compose_cfg(
        *overrides("fixed", "fp16"),
        f"trainer.max_steps={steps}",
        f"trainer.log_every={log_every}",
        "trainer.eval_every=12",
    )
    recipe = Recipe(cfg, tmp_path)
    recipe.setup()
    try:
        with host_syncs() as found:
            recipe.train()
    finally:
        recipe.cleanup()
    at_log = [s for s in found if "read_log" in s.within]
    assert len(at_log) == steps // log_every  # one read of all the interval's values per log point
    elsewhere = [str(s) for s in found if not {"read_log", "Recipe.evaluate", "Recipe.save"} & set(s.within)]
    assert not elsewhere, f"host syncs in the loop outside log points, evaluations and checkpoints: {elsewhere}"
