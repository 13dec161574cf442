"""The gradient methods' C++ Gramian kernel (mtl_bench/cpp/gramian_cpu.cpp) and when `block_gramian` takes it."""

from __future__ import annotations

import logging

import pytest
import torch

from mtl_bench.balancers import PCGrad
from mtl_bench.gradient_engine import gramian as gramian_module
from mtl_bench.gradient_engine.gramian import KERNEL_MIN_NUMEL, block_gramian
from tests.helpers.balancer_kit import built_kernel_or_skip, on_one_and_two_threads


def kernel_or_skip():
    return built_kernel_or_skip(gramian_module.gramian_kernel, "Gramian kernel")


@pytest.mark.slow
@pytest.mark.parametrize("t", [1, 2, 3, 4, 5, 9, 10, 17])
@pytest.mark.parametrize("p", [1, 15, 16, 2047, 2049, 70_001])
def test_kernel_is_the_gramian(t, p):
    # rows with a stride past their length (a view into wider rows): every tile, tail and chunk edge
    wide = torch.randn(t, p + 5, generator=torch.Generator().manual_seed(t * 1000 + p))
    m = wide[:, 2 : p + 2]
    got = kernel_or_skip().gramian(m)
    exact = m.double() @ m.double().T
    assert got.dtype == torch.float32 and torch.equal(got, got.T)
    torch.testing.assert_close(got.double(), exact, rtol=1e-6, atol=1e-6 * p**0.5)


@pytest.mark.slow
def test_kernel_is_closer_than_mm_and_the_same_on_any_thread_count():
    m = torch.randn(10, 915_000, generator=torch.Generator().manual_seed(0)) + 0.5  # large sums: rounding shows
    module = kernel_or_skip()
    exact = m.double() @ m.double().T
    one, two = on_one_and_two_threads(lambda: module.gramian(m))
    assert torch.equal(one, two)
    assert (one.double() - exact).abs().max() <= ((m @ m.T).double() - exact).abs().max()


def test_large_float32_cpu_blocks_take_the_kernel(monkeypatch):
    calls = []

    class Fake:
        def gramian(self, m):
            calls.append(m.shape)
            return m @ m.T

    monkeypatch.setattr(gramian_module, "gramian_kernel", lambda: Fake())
    large = torch.randn(4, KERNEL_MIN_NUMEL // 4)
    block_gramian(large)
    block_gramian(torch.randn(4, 100))  # small: torch.mm
    block_gramian(large.double())  # not float32: torch.mm on the float32 copy
    block_gramian(large[:, ::2])  # rows not dense: torch.mm
    assert calls == [large.shape]


def test_without_a_kernel_mm_computes_it_and_it_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(gramian_module.cpp_kernels, "build", lambda *args: (None, "RuntimeError: Ninja is required"))
    monkeypatch.setattr(gramian_module.cpp_kernels, "_said", set())
    large = torch.randn(2, KERNEL_MIN_NUMEL // 2)
    with caplog.at_level(logging.WARNING, logger="mtl_bench"):
        first = block_gramian(large)
        block_gramian(large)
    torch.testing.assert_close(first, large @ large.T)
    said = [r.getMessage() for r in caplog.records if "Gramian kernel" in r.getMessage()]
    assert said == [
        "gradient methods: the C++ Gramian kernel cannot be built here (RuntimeError: Ninja is required); "
        "torch.mm computes it"
    ]


def test_the_kernel_is_built_with_the_balancer_when_its_blocks_will_take_it(monkeypatch):
    built = []
    monkeypatch.setattr(gramian_module, "gramian_kernel", lambda: built.append(1))
    PCGrad(["a", "b"], [torch.nn.Parameter(torch.zeros(100))])  # small blocks: torch.mm, nothing to build
    PCGrad(["a", "b"], [torch.nn.Parameter(torch.zeros(KERNEL_MIN_NUMEL // 2, dtype=torch.float64))])
    assert built == []
    PCGrad(["a", "b"], [torch.nn.Parameter(torch.zeros(KERNEL_MIN_NUMEL // 2))])  # 2 x 2^19 floats: the kernel
    assert built == [1]
