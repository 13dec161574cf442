"""TrimmedMean: the trimmed direction and the kept shares by hand, and the parameters of torchjd 0.18's
TrimmedMean after 6 steps."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import BackwardContext, TrimmedMean
from mtl_bench.balancers.trimmed_mean import drop_extremes
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_per_task_is_the_joint_step,
    assert_same_parameters,
    make_model,
    train_ours,
    train_torchjd,
)

TASKS4 = ("a", "b", "c", "d")


def build(model, tasks=TASKS3, **options) -> TrimmedMean:
    return TrimmedMean(list(tasks), list(model.trunk.parameters()), **options)


def test_direction_and_shares_by_hand():
    # Shared parameter θ ∈ R², L_i = c_i·θ: rows (1, 9), (5, 2), (3, 4) per coordinate; trim 1 keeps the median:
    # coordinate 0: 3 (task c), coordinate 1: 4 (task c). So d = (3, 4) and task c's share is 1.
    theta = torch.zeros(2, requires_grad=True)
    rows = {"a": torch.tensor([1.0, 9.0]), "b": torch.tensor([5.0, 2.0]), "c": torch.tensor([3.0, 4.0])}
    bal = TrimmedMean(list(rows), [theta], trim=1)
    metrics = bal.backward({t: (r * theta).sum() for t, r in rows.items()}, theta)
    assert theta.grad.tolist() == [3.0, 4.0]
    assert [metrics[f"weight/{t}"].item() for t in rows] == [0.0, 0.0, 1.0]
    theta.grad = None
    metrics = TrimmedMean(list(rows), [theta], trim=0).backward({t: (r * theta).sum() for t, r in rows.items()}, theta)
    assert theta.grad.tolist() == pytest.approx([3.0, 5.0])  # trim 0: the mean
    assert [metrics[f"weight/{t}"].item() for t in rows] == pytest.approx([1 / 3] * 3)


@pytest.mark.parametrize(("tasks", "trim"), [(TASKS3, 1), (TASKS4, 1)])
def test_matches_torchjd(tasks, trim):
    aggregation = pytest.importorskip("torchjd.aggregation")
    ours, reference = make_model(tasks), make_model(tasks)
    train_ours(ours, build(ours, tasks, trim=trim), 6, tasks)
    train_torchjd(reference, aggregation.TrimmedMean(trim_number=trim), 6, tasks)
    assert_same_parameters(ours, reference)


def test_per_task_mode_with_scaler_matches_the_joint_step():
    ctx = BackwardContext(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8))
    assert_per_task_is_the_joint_step(build, ["c", "b", "a"], ctx, scale=2.0**8)


def test_too_much_trimming_is_one_line():
    with pytest.raises(
        ValueError, match=r"^trim: must be an integer in \[0, 1\] for 3 tasks \(at most \(T - 1\) // 2\)"
    ):
        build(make_model(), trim=2)


def test_dropping_the_extremes_is_the_sorted_trim_of_one():
    # ties included (rounded values), a coordinate where all rows are equal, and an outlier 1e8 beside small values
    block = (torch.randn(7, 40, 30, generator=torch.Generator().manual_seed(0)) * 4).round()
    block[:, 0, 0] = 2.0
    block[3, 1, 1] = 1e8
    direction, kept = drop_extremes(block)
    ordered, rows = torch.sort(block, dim=0)
    torch.testing.assert_close(direction, ordered[1:-1].mean(dim=0))
    assert direction[0, 0] == 2.0 and kept.sum() == 5 * 40 * 30
    untied = torch.randn(7, 40, 30, generator=torch.Generator().manual_seed(1))  # which row is kept: unambiguous
    assert torch.equal(drop_extremes(untied)[1], torch.bincount(torch.sort(untied, dim=0)[1][1:-1].reshape(-1)))
