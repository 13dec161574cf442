"""Non-finite steps are skipped: on the device for fused optimizers, by one host read for the others."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.engine.nonfinite import nonfinite_flag, step_unless
from mtl_bench.optim import ScaledAdam


def params_with_grads(bad: bool) -> list[torch.nn.Parameter]:
    ps = [torch.nn.Parameter(torch.ones(3, 3)), torch.nn.Parameter(torch.ones(3))]
    for p in ps:
        p.grad = torch.full_like(p, 0.5)
    if bad:
        ps[1].grad[0] = float("nan")
    return ps


@pytest.mark.parametrize("bad, value", [(False, 0.0), (True, 1.0)])
def test_flag_reads_any_nan_or_inf(bad, value):
    assert nonfinite_flag([p.grad for p in params_with_grads(bad)]).item() == value
    inf = params_with_grads(False)
    inf[0].grad[0, 0] = float("inf")
    assert nonfinite_flag([p.grad for p in inf]).item() == 1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.Adam(ps, lr=0.1, fused=True),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
        lambda ps: torch.optim.RMSprop(ps, lr=0.1),  # not fused: the flag is read on the host
        lambda ps: ScaledAdam(ps, lr=0.1, kernel=False),  # skips by itself
    ],
)
@pytest.mark.parametrize("bad", [False, True])
def test_step_is_skipped_exactly_when_flagged(make, bad, monkeypatch):
    ps = params_with_grads(bad)
    opt = make(ps)
    before = [p.detach().clone() for p in ps]
    step_unless(opt, nonfinite_flag([p.grad for p in ps]))
    changed = any(not torch.equal(a, p) for a, p in zip(before, ps))
    assert changed != bad
    assert all(torch.isfinite(p).all() for p in ps)
    assert not hasattr(opt, "found_inf")  # the flag is handed over for this step only


def test_fused_optimizers_skip_without_a_host_read(monkeypatch):
    ps = params_with_grads(True)
    opt = torch.optim.Adam(ps, lr=0.1, fused=True)
    flag = nonfinite_flag([p.grad for p in ps])
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("host read"))
    step_unless(opt, flag)
    monkeypatch.undo()
    assert opt.state[ps[0]]["step"].item() == 0  # the fused kernel undid its step count
