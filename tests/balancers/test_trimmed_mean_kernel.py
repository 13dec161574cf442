"""TrimmedMean's C++ trim=1 kernel (mtl_bench/cpp/trimmed_mean_cpu.cpp) and when `block_drop_extremes` takes it."""

from __future__ import annotations

import logging

import pytest
import torch

from mtl_bench.balancers import TrimmedMean, trimmed_mean
from mtl_bench.balancers.trimmed_mean import block_drop_extremes, drop_extremes
from mtl_bench.gradient_engine import gramian as gramian_module
from mtl_bench.gradient_engine.gramian import KERNEL_MIN_NUMEL
from tests.balancers import test_trimmed_mean
from tests.helpers.balancer_kit import TASKS3, built_kernel_or_skip, on_one_and_two_threads

TASKS4 = ("a", "b", "c", "d")


def kernel_or_skip():
    return built_kernel_or_skip(trimmed_mean.trim_kernel, "trim=1 kernel")


def exact(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch path in float64, rounded once to float32: what the kernel's double sum gives (the sums of these
    test values are exact in double, so the order of the additions does not matter)."""
    direction, kept = drop_extremes(m.double())
    return direction.float(), kept


@pytest.mark.slow
@pytest.mark.parametrize("t", [3, 4, 5, 10, 17])
@pytest.mark.parametrize("p", [1, 15, 16, 17, 2047, 70_001])
def test_kernel_is_the_torch_path(t, p):
    # rows with a stride past their length (a view into wider rows): every vector, tail and column-group edge;
    # ties (rounded values), a column where all rows are equal (rows 0 and T-1 dropped), signed zeros, an outlier
    generator = torch.Generator().manual_seed(t * 1000 + p)
    for scale in (3.0, None):
        wide = torch.randn(t, p + 5, generator=generator)
        wide = (wide * scale).round() if scale else wide
        m = wide[:, 2 : p + 2]
        if scale and p >= 3:
            m[:, 0] = 2.0
            m[:, 1] = 0.0
            m[1, 1] = -0.0
            m[t // 2, 2] = 1e8
        direction, kept = kernel_or_skip().drop_extremes(m)
        assert direction.shape == (p,) and kept.dtype == torch.int64
        want_direction, want_kept = exact(m)
        assert torch.equal(kept, want_kept) and torch.equal(kept, drop_extremes(m)[1])
        assert torch.equal(direction, want_direction)
        # the float32 torch path sums in float: the same up to its rounding
        torch.testing.assert_close(direction, drop_extremes(m)[0], rtol=1e-6, atol=1e-6)
        if scale and p >= 3:
            assert direction[0] == 2.0 and kept.sum() == (t - 2) * p


@pytest.mark.slow
def test_kernel_is_closer_than_torch_and_the_same_on_any_thread_count():
    m = torch.randn(10, 915_000, generator=torch.Generator().manual_seed(0)) * 100 + 0.5  # large sums: rounding shows
    module = kernel_or_skip()
    one, two = on_one_and_two_threads(lambda: module.drop_extremes(m))
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    truth = drop_extremes(m.double())[0]
    assert (one[0].double() - truth).abs().max() <= (drop_extremes(m)[0].double() - truth).abs().max()


@pytest.mark.slow
def test_non_finite_values_do_not_fail():
    m = torch.randn(5, 100, generator=torch.Generator().manual_seed(2))
    m[0, 3] = m[2, 40] = float("nan")  # row 0's NaN: the first max and the last min, yet summed
    m[1, 50], m[4, 60] = float("inf"), float("-inf")
    direction, kept = kernel_or_skip().drop_extremes(m)
    assert direction[3].isnan() and direction[40].isnan()
    finite = [k for k in range(100) if k not in (3, 40)]
    assert torch.equal(direction[finite], exact(m)[0][finite])  # ±inf are the extremes: dropped


class Spy:
    """The built kernel, recording the shapes it is called with."""

    def __init__(self, module) -> None:
        self.module, self.calls = module, []

    def drop_extremes(self, m):
        self.calls.append(tuple(m.shape))
        return self.module.drop_extremes(m)


@pytest.mark.slow
@pytest.mark.parametrize("tasks", [TASKS3, TASKS4])
def test_the_method_tests_pass_on_the_kernel_path(monkeypatch, tasks):
    spy = Spy(kernel_or_skip())
    monkeypatch.setattr(trimmed_mean, "trim_kernel", lambda: spy)
    monkeypatch.setattr(gramian_module, "KERNEL_MIN_NUMEL", 1)  # every block takes the kernels
    test_trimmed_mean.test_matches_torchjd(tasks, 1)
    test_trimmed_mean.test_direction_and_shares_by_hand()
    test_trimmed_mean.test_per_task_mode_with_scaler_matches_the_joint_step()
    assert (3, 2) in spy.calls and len(spy.calls) > 6  # the by-hand case and the trained model's blocks


def test_large_float32_cpu_blocks_take_the_kernel(monkeypatch):
    calls = []

    class Fake:  # the torch path on the flat rows: the kernel's contract
        def drop_extremes(self, m):
            calls.append(tuple(m.shape))
            return drop_extremes(m)

    monkeypatch.setattr(trimmed_mean, "trim_kernel", lambda: Fake())
    large = torch.randn(4, 512, 512).transpose(1, 2)  # 2^20 floats, rows laid out transposed (a Linear's weight)
    direction, kept = block_drop_extremes(large)
    want = drop_extremes(large)
    assert direction.shape == large[0].shape and direction.stride() == large[0].stride()
    assert torch.equal(direction, want[0]) and torch.equal(kept, want[1])
    block_drop_extremes(torch.randn(4, 100, 10))  # small: torch
    block_drop_extremes(large.double())  # not float32: torch
    assert calls == [(4, 512 * 512)]


def test_without_a_kernel_torch_computes_it_and_it_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(trimmed_mean.cpp_kernels, "build", lambda *args: (None, "RuntimeError: Ninja is required"))
    monkeypatch.setattr(trimmed_mean.cpp_kernels, "_said", set())
    large = torch.randn(4, KERNEL_MIN_NUMEL // 4)
    with caplog.at_level(logging.WARNING, logger="mtl_bench"):
        first = block_drop_extremes(large)
        block_drop_extremes(large)
    want = drop_extremes(large)
    assert torch.equal(first[0], want[0]) and torch.equal(first[1], want[1])
    said = [r.getMessage() for r in caplog.records if "trim=1 kernel" in r.getMessage()]
    assert said == [
        "TrimmedMean: the C++ trim=1 kernel cannot be built here (RuntimeError: Ninja is required); torch computes it"
    ]


def test_the_kernel_is_built_with_the_balancer_when_its_blocks_will_take_it(monkeypatch):
    built = []
    monkeypatch.setattr(trimmed_mean, "trim_kernel", lambda: built.append(1))
    monkeypatch.setattr(gramian_module, "gramian_kernel", lambda: None)  # not this test's build
    tasks = ["a", "b", "c"]
    TrimmedMean(tasks, [torch.nn.Parameter(torch.zeros(100))])  # small blocks: torch, nothing to build
    TrimmedMean(tasks, [torch.nn.Parameter(torch.zeros(KERNEL_MIN_NUMEL // 2, dtype=torch.float64))])
    TrimmedMean(tasks, [torch.nn.Parameter(torch.zeros(KERNEL_MIN_NUMEL // 2))], trim=0)  # the sort: no kernel
    assert built == []
    TrimmedMean(tasks, [torch.nn.Parameter(torch.zeros(KERNEL_MIN_NUMEL // 2))])  # 3 x 2^19 floats: the kernel
    assert built == [1]
