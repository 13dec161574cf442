"""model=decision: x as a parameter (its start given, drawn from a box with the run's seed, or the origin), x as a
network's output for the input (`hidden`), identity heads, and the refusals."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.models import DecisionVariables

HEADS = {"f1": 3, "f2": 3}


def test_x_is_the_parameter_every_task_reads():
    model = DecisionVariables((1,), HEADS, init=[1.0, -2.0, 0.5])
    out = model(torch.ones(4, 1))
    for name in HEADS:
        assert torch.equal(out.preds[name], torch.tensor([[1.0, -2.0, 0.5]] * 4))
    assert [p.shape for p in model.shared_parameters()] == [torch.Size([3])]
    assert torch.equal(DecisionVariables((1,), HEADS).trunk.x, torch.zeros(3))  # null: the origin


def test_init_range_draws_x0_in_the_box_from_the_global_seed():
    torch.manual_seed(7)
    x = DecisionVariables((1,), {"f1": 1000}, init_range=[-0.5, 0.5]).trunk.x.detach()
    assert -0.5 <= float(x.min()) and float(x.max()) <= 0.5 and abs(float(x.mean())) < 0.05
    assert float(x.var()) == pytest.approx(1 / 12, rel=0.1)  # uniform on a unit interval
    torch.manual_seed(7)
    assert torch.equal(DecisionVariables((1,), {"f1": 1000}, init_range=[-0.5, 0.5]).trunk.x.detach(), x)


def test_hidden_makes_x_a_function_of_the_input():
    model = DecisionVariables((3,), HEADS, hidden=[8])
    x = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    out = model(x).preds
    assert out["f1"].shape == (2, 3) and torch.equal(out["f1"], out["f2"])
    assert not torch.allclose(out["f1"][0], out["f1"][1])  # two inputs (two preferences appended): two points
    assert model.last_shared_layer is model.trunk[-1]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(init=[1.0]), "^init: need 3 values"),
        (dict(init=[0.0] * 3, init_range=[0, 1]), "^init_range: x0 is given by init already"),
        (dict(init_range=[1, 1]), r"^init_range: must be \[low, high\] with low < high"),
        (dict(hidden=[8], init_range=[0, 1]), "^hidden: x is the network's output"),
        (dict(hidden=[]), "^hidden: need at least one layer width"),
        (dict(hidden=[0]), "^hidden: need at least one layer width"),
    ],
)
def test_refusals_name_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecisionVariables((1,), HEADS, **kwargs)
    with pytest.raises(ValueError, match="^heads: every task must read the same x"):
        DecisionVariables((1,), {"f1": 2, "f2": 3})
