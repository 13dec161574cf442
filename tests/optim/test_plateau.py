"""Plateau: torch's ReduceLROnPlateau stepped once per evaluation with a validation criterion, through the engine."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.engine.recipe import train
from mtl_bench.optim import Plateau

SMALL = ["trainer=smoke", "tasks.n_train=512", "tasks.n_val=64", "tasks.n_test=64", "model.widths=[32,32]"]


def test_the_lr_drops_after_patience_evaluations_without_improvement():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    plateau = Plateau(optimizer, factor=0.5, patience=1, min_lr=0.3)
    for _ in range(100):
        plateau.step()  # optimizer steps change nothing
    for cost, lr in ((1.0, 1.0), (1.0, 1.0), (1.0, 0.5), (1.0, 0.5), (1.0, 0.3)):
        plateau.validation_step(cost)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lr)
    with pytest.raises(ValueError, match="factor: must be in"):
        Plateau(optimizer, factor=1.5)


def test_the_engine_steps_it_with_the_validation_criterion(compose_cfg, tmp_path):
    """eval_every 2 over 20 steps: the schedule is stepped at each of the 10 evaluations, never per optimizer step,
    with the validation loss of t0 (lr 0: it never improves after the first)."""
    cfg = compose_cfg(
        *SMALL,
        "optim/schedule=plateau",
        "optim.schedule.criterion=t0/loss",
        "optim.schedule.patience=0",
        "optim.schedule.factor=0.5",
        "optim.schedule.min_lr=0",
        "optim.lr=0.0",
        "trainer.eval_every=2",
    )
    train(cfg, tmp_path)
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert state["scheduler"]["best"] > 0 and state["scheduler"]["num_bad_epochs"] == 0  # patience 0: reset each time
    assert state["scheduler"]["last_epoch"] == 10  # stepped at each of the 10 evaluations, not per step
