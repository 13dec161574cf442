"""The engine on graph batches (a task set whose loader yields PyG `Batch`es): tasks=qm9 with model=mpnn on the first
300 molecules, joint and per-task steps, gradient accumulation, bf16, DDP-style rank slices, exact resume."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("rdkit")
pytest.importorskip("torch_geometric")

from mtl_bench.engine.data import BatchSource, StepSampler, to_device  # noqa: E402
from mtl_bench.engine.recipe import train  # noqa: E402
from mtl_bench.tasks.qm9 import QM9  # noqa: E402

TARGETS = "[mu,homo,u0]"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("qm9cache"))


@pytest.fixture
def qm9_conf(compose_cfg, cache_dir):
    def _conf(*overrides: str):
        return compose_cfg(
            "tasks=qm9",
            "model=mpnn",
            "model.dim=16",
            "trainer=smoke",
            "trainer.max_steps=2",
            "trainer.batch_size=8",
            "trainer.eval_batch_size=32",
            "trainer.device=cpu",
            "tasks.limit=300",
            "tasks.n_test=40",
            "tasks.n_val=40",
            f"tasks.targets={TARGETS}",
            f"tasks.cache_dir={cache_dir}",
            *overrides,
        )

    return _conf


@pytest.mark.parametrize(
    "overrides",
    [
        (),
        ("trainer.step_mode=per_task",),
        ("trainer.grad_accumulation_steps=2",),
        ("precision=bf16",),
        ("balancer=imtl",),
    ],
    ids=["joint", "per_task", "accumulation", "bf16", "imtl"],
)
def test_two_steps_on_graph_batches(qm9_conf, tmp_path, overrides):
    result = train(qm9_conf(*overrides), tmp_path)
    assert result.step == 2
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert set(metrics["test"]) == {"mu", "homo", "u0"}
    for values in metrics["test"].values():
        assert values["mae"] > 0 and values["mae"] == values["mae"]  # finite, named by target


def test_resumed_run_ends_with_the_numbers_of_an_uninterrupted_one(qm9_conf, tmp_path):
    straight = train(qm9_conf("trainer.max_steps=4"), tmp_path / "straight")
    train(qm9_conf("trainer.max_steps=2"), tmp_path / "cut")
    resumed = train(qm9_conf("trainer.max_steps=4", "trainer.resume=auto"), tmp_path / "cut")
    assert resumed.step == 4 and resumed.test == straight.test and resumed.val == straight.val


def test_rank_slices_of_a_graph_batch_cover_the_global_batch(cache_dir):
    # DDP: each rank loads its slice of the same global batch, as with tensors.
    ts = QM9(targets=["mu"], n_test=40, n_val=40, limit=300, cache_dir=cache_dir)
    cpu = torch.device("cpu")
    whole = BatchSource(ts.train, StepSampler(len(ts.train), 8, seed=0), 0, 8, cpu).batch(3)
    halves = [BatchSource(ts.train, StepSampler(len(ts.train), 8, seed=0), r, 4, cpu).batch(3) for r in (0, 1)]
    assert whole[0].num_graphs == 8 and all(h[0].num_graphs == 4 for h in halves)
    torch.testing.assert_close(torch.cat([h[1]["mu"] for h in halves]), whole[1]["mu"])
    torch.testing.assert_close(torch.cat([h[0].x for h in halves]), whole[0].x)


def test_to_device_moves_tensors_dicts_and_objects_with_to():
    class Graphs:
        def to(self, device, non_blocking=False):
            self.moved = (device, non_blocking)
            return self

    cpu = torch.device("cpu")
    graphs, targets = to_device(Graphs(), {"a": torch.ones(2)}, cpu)
    assert graphs.moved == (cpu, True) and torch.equal(targets["a"], torch.ones(2))
    inputs, _ = to_device({"left": torch.zeros(1)}, {}, cpu)
    assert torch.equal(inputs["left"], torch.zeros(1))
