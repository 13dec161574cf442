"""Data-parallel training (2 CPU processes, gloo) through the same `train` the CLI runs under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.processes import free_port, join_torchrun_env, spawn_and_wait

SMALL = ["trainer=smoke", "tasks.n_train=512", "tasks.n_val=64", "tasks.n_test=64", "model.widths=[32,32]", "optim=sgd"]


def worker(rank: int, world: int, port: int, conf, run_dir: str, out_dir: str) -> None:
    join_torchrun_env(rank, world, port)
    torch.set_num_threads(1)
    from mtl_bench.engine import compose, recipe

    built = {}
    build = compose.build

    def keep(key, *args, **kwargs):  # hold on to this rank's balancer to compare its state afterwards
        built[key] = build(key, *args, **kwargs)
        return built[key]

    compose.build = keep
    recipe.train(conf, Path(run_dir) if rank == 0 else Path(out_dir) / "ignored")
    torch.save(built["balancer"].state_dict(), Path(out_dir) / f"balancer{rank}.pt")


def raising_worker(rank: int, world: int, port: int, conf, run_dir: str, out_dir: str) -> None:
    """Rank 1 alone meets NaN targets: with on_nonfinite=raise both ranks must stop (none may hang)."""
    join_torchrun_env(rank, world, port)
    torch.set_num_threads(1)
    from mtl_bench.engine import compose, recipe
    from mtl_bench.errors import NonFiniteLossError

    build = compose.build

    def poisoned(key, *args, **kwargs):
        part = build(key, *args, **kwargs)
        if key == "tasks" and rank == 1:
            part.train.targets["t1"][:] = float("nan")
        return part

    compose.build = poisoned
    try:
        recipe.train(conf, Path(run_dir) if rank == 0 else Path(out_dir) / "ignored")
    except NonFiniteLossError as err:
        (Path(out_dir) / f"stopped{rank}.txt").write_text(str(err))


def run_two_ranks(conf, run_dir: Path, out_dir: Path, target=worker) -> None:
    spawn_and_wait(
        target,
        (2, free_port(), conf, str(run_dir), str(out_dir)),
        nprocs=2,
        timeout_s=120,
        what="DDP workers did not finish",
    )


@pytest.mark.parametrize("mode", ["joint", "per_task"])
def test_two_ranks_with_batch_b_match_one_process_with_batch_2b(compose_cfg, tmp_path, mode):
    from mtl_bench.engine.recipe import train

    two = compose_cfg(*SMALL, "trainer.batch_size=16", f"trainer.step_mode={mode}")
    one = compose_cfg(*SMALL, "trainer.batch_size=32", f"trainer.step_mode={mode}")
    run_two_ranks(two, tmp_path / "ddp", tmp_path)
    train(one, tmp_path / "single")
    a = torch.load(tmp_path / "ddp" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "single" / "checkpoints" / "last.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)
    assert not (tmp_path / "ignored").exists()  # rank 1 used rank 0's run dir and wrote nothing


def test_gradnorm_weights_are_identical_on_both_ranks(compose_cfg, tmp_path):
    conf = compose_cfg(*SMALL, "trainer.batch_size=16", "balancer=gradnorm")
    run_two_ranks(conf, tmp_path / "ddp", tmp_path)
    r0, r1 = (torch.load(tmp_path / f"balancer{r}.pt", weights_only=True) for r in range(2))
    assert torch.equal(r0["weights"], r1["weights"]) and r0["opt_step"].item() == 20
    assert not torch.equal(r0["weights"], torch.ones(2))


def test_nonfinite_raise_on_one_rank_stops_both(compose_cfg, tmp_path):
    conf = compose_cfg(*SMALL, "trainer.batch_size=16", "trainer.on_nonfinite=raise")
    run_two_ranks(conf, tmp_path / "ddp", tmp_path, target=raising_worker)
    messages = [(tmp_path / f"stopped{rank}.txt").read_text() for rank in range(2)]
    assert all(m.startswith("non-finite loss for task 't1' at step 1 ") for m in messages)


@pytest.mark.slow
def test_torchrun_cli_trains_with_two_processes(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    result = subprocess.run(
        [
            str(torchrun),
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            "-m",
            "mtl_bench",
            "train",
            *SMALL,
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "x 2 ranks" in result.stderr
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # rank 1 wrote nothing anywhere
