"""Multi-input task sets (each task its own data, as Office-31's domains): per-task sample streams from each
task's own dataset, an epoch as long as the largest task's, each task evaluated on its own data, and a clear
error for joint steps."""

from __future__ import annotations

import pytest
import torch
from omegaconf import open_dict

from mtl_bench.engine.evaluate import evaluate
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError
from mtl_bench.models import MLP
from mtl_bench.tasks import Split, Task, TaskSet
from mtl_bench.tasks.losses import mse_loss, mse_metrics

SIZES = {"a": 48, "b": 20}


def domain(task: str, n: int, offset: float, seed: int) -> Split:
    """Inputs of this task alone, shifted so that the two tasks' data differ."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g) + offset
    return Split(x, {task: x.sum(1, keepdim=True) * (1 + offset)})


class TwoDomains(TaskSet):
    def __init__(self) -> None:
        tasks = [Task(name, 1, mse_loss, mse_metrics, {"mse": False}) for name in SIZES]
        splits = [
            {
                name: domain(name, SIZES[name] if i == 0 else 8, offset, 10 * i + k)
                for k, (name, offset) in enumerate(zip(SIZES, (0.0, 3.0)))
            }
            for i in range(3)
        ]
        super().__init__(tasks, (3,), *splits)


def config(compose_cfg, step_mode: str = "per_task"):
    cfg = compose_cfg(
        "model.widths=[8]",
        "trainer.batch_size=4",
        "trainer.epochs=2",
        "trainer.eval_every=100",
        "trainer.log_every=1",
        "trainer.checkpoint_every=0",
        "trainer.device=cpu",
        f"trainer.step_mode={step_mode}",
    )
    with open_dict(cfg):
        cfg.tasks = {"_target_": f"{__name__}.TwoDomains"}
    return cfg


def test_each_task_trains_on_its_own_data_for_epochs_of_the_largest_task(compose_cfg, tmp_path):
    result = train(config(compose_cfg), tmp_path)
    assert result.step == 2 * (SIZES["a"] // 4)  # the larger domain sets the epoch; the smaller one cycles
    assert set(result.test) == {"a", "b"}


def test_each_task_is_evaluated_on_its_own_data():
    tasks = TwoDomains()
    model = MLP((3,), {"a": 1, "b": 1}, widths=(4,))
    got = evaluate(model, tasks.tasks, tasks.test, torch.device("cpu"), batch_size=3)
    for task in tasks.tasks:
        split = tasks.test[task.name]
        pred = model(split.inputs).preds[task.name]
        assert got[task.name]["loss"] == pytest.approx(mse_loss(pred, split.targets[task.name]).item(), rel=1e-5)


def test_joint_steps_on_a_multi_input_task_set_is_one_line(compose_cfg, tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"^trainer.step_mode=joint: tasks=TwoDomains is multi-input .* "
        r"set trainer.step_mode=per_task$",
    ):
        train(config(compose_cfg, "joint"), tmp_path)


def test_a_multi_input_split_names_every_task():
    tasks = [Task(name, 1, mse_loss, mse_metrics, {"mse": False}) for name in SIZES]
    with pytest.raises(ValueError, match="one dataset per task"):
        TaskSet(tasks, (3,), {"a": domain("a", 4, 0, 0)}, {}, {})
