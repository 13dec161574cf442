"""ExcessMTL's C++ excess-risk kernel (mtl_bench/cpp/excess_mtl_cpu.cpp): the same S' bits and excess risks as the torch
path, and when the balancer takes it."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from mtl_bench.balancers import ExcessMTL, excess_mtl
from mtl_bench.gradient_engine import gramian as gramian_module
from mtl_bench.gradient_engine.gramian import KERNEL_MIN_NUMEL
from tests.balancers import test_excess_mtl
from tests.helpers.balancer_kit import built_kernel_or_skip, on_one_and_two_threads


def kernel_or_skip():
    return built_kernel_or_skip(excess_mtl.excess_kernel, "excess-risk kernel")


def torch_path(g: torch.Tensor, s: torch.Tensor, scale_sq: torch.Tensor | None):
    """ExcessMTL's torch path on one (T, P) block: S' and the float32 terms of e."""
    square = g.square() if scale_sq is None else g.square() / scale_sq
    total = s + square
    return total, square / torch.sqrt(total + 1e-7)


def run_kernel(module, g, s, scale_sq):
    out = torch.full_like(g, float("nan"))
    e = module.excess(g, s, out, 1.0 if scale_sq is None else scale_sq.item())
    return out, e


@pytest.mark.slow
@pytest.mark.parametrize("t", [1, 2, 3, 10, 17])
@pytest.mark.parametrize("p", [1, 15, 16, 17, 520, 16_385, 300_007])
@pytest.mark.parametrize("scale", [None, 2.0**8, 3.0])  # none, the grad scaler's (a power of two), any other
def test_kernel_is_the_torch_path(t, p, scale):
    generator = torch.Generator().manual_seed(t * 1000 + p)
    g = torch.randn(t, p, generator=generator)
    g[:, ::7] = 0  # zero gradients (a zero term) and ties
    g[:, 1::5] = g[:, :1]
    s = torch.rand(t, p, generator=generator) * 10
    s[:, ::3] = 0  # the first step: S = 0, S' = g² and the 1e-7 matters where g = 0
    scale_sq = None if scale is None else torch.tensor(scale, dtype=torch.float32) ** 2
    out, e = run_kernel(kernel_or_skip(), g, s, scale_sq)
    total, terms = torch_path(g, s, scale_sq)
    assert torch.equal(out, total)  # the same float operations, no fused multiply-add: the same bits
    # e adds the same float terms in double: within rounding to float of their exact sum, and within float32
    # summation error of torch's float sum.
    assert e.dtype == torch.float32
    torch.testing.assert_close(e.double(), terms.double().sum(1), rtol=2**-23, atol=0)
    torch.testing.assert_close(e, terms.sum(1), rtol=1e-5, atol=0)


@pytest.mark.slow
def test_non_finite_gradients_give_the_torch_paths_nan_and_inf():
    g, s = torch.randn(3, 40), torch.rand(3, 40)
    g[0, 5], g[1, 7], g[2, 9] = math.nan, math.inf, 1e19  # rows 0, 1: NaN (inf / inf); row 2: g² near float's max
    out, e = run_kernel(kernel_or_skip(), g, s, None)
    total, terms = torch_path(g, s, None)
    torch.testing.assert_close(out, total, rtol=0, atol=0, equal_nan=True)
    assert e[:2].isnan().all() and e[2].isfinite()
    torch.testing.assert_close(e, terms.sum(1), rtol=1e-6, atol=0, equal_nan=True)


@pytest.mark.slow
def test_the_kernel_is_the_same_on_any_thread_count():
    generator = torch.Generator().manual_seed(0)
    g, s = torch.randn(10, 915_000, generator=generator), torch.rand(10, 915_000, generator=generator)
    module = kernel_or_skip()
    one, two = on_one_and_two_threads(lambda: run_kernel(module, g, s, None))
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


@pytest.fixture
def every_cpu_float32_block(monkeypatch):
    """The kernel for every float32 CPU block, also the test models' tiny ones; counts its calls."""
    module = kernel_or_skip()
    calls = []

    class Counted:
        def excess(self, *args):
            calls.append(args[0].shape)
            return module.excess(*args)

    monkeypatch.setattr(excess_mtl, "excess_kernel", lambda: Counted())
    monkeypatch.setattr(excess_mtl, "takes_kernel", lambda p, t: p.device.type == "cpu" and p.dtype == torch.float32)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize(
    "check",
    [
        test_excess_mtl.test_two_steps_by_hand,
        lambda: test_excess_mtl.test_matches_torchjd(1),
        lambda: test_excess_mtl.test_matches_torchjd(3),
        test_excess_mtl.test_matches_libmtl_main_reference_numbers,
        test_excess_mtl.test_resume_continues_and_a_skipped_step_keeps_the_state,
        test_excess_mtl.test_per_task_mode_with_scaler_matches_the_joint_step,
    ],
)
def test_the_method_tests_pass_on_the_kernel_path(every_cpu_float32_block, check):
    check()
    assert every_cpu_float32_block  # the kernel computed them


@pytest.mark.slow
def test_rows_laid_out_unlike_s_take_the_kernel_on_s_relaid_once(every_cpu_float32_block):
    # rows transposed in memory (as autograd may return a Linear's weight gradient): S follows their layout
    param = torch.nn.Parameter(torch.zeros(6, 4))
    bal, reference = ExcessMTL(["a", "b"], [param]), torch.zeros(2, 6, 4)
    for step in range(2):
        block = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(step)).transpose(1, 2)
        state: dict = {}
        e = bal.aggregator._kernel_excess(0, block, None, state)
        total, terms = torch_path(block, reference, None)
        assert e is not None and state["sq_grad_sum_0"].stride() == block.stride()
        torch.testing.assert_close(e, terms.reshape(2, -1).sum(1), rtol=1e-6, atol=0)
        bal._stage(**{"aggregator.sq_grad_sum_0": state["sq_grad_sum_0"]})  # as AggregatorBalancer stages it
        bal._commit(False)
        sq_grad_sum = bal.aggregator.sq_grad_sum_0
        assert torch.equal(sq_grad_sum, total) and sq_grad_sum.stride() == block.stride()
        reference = total
    assert len(every_cpu_float32_block) == 2


# ---------------------------------------------------------------- when the kernel is taken (fast: no build)


class Fake:
    """The kernel's contract computed by torch, recording the blocks it gets."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def excess(self, g, s, out, scale_sq):
        self.calls.append(tuple(g.shape))
        total, terms = torch_path(g, s, torch.tensor(scale_sq))
        out.copy_(total)
        return terms.sum(1)


def one_step(param: torch.nn.Parameter, bal: ExcessMTL, seed: int = 0, nan: bool = False) -> dict:
    c = torch.randn(2, *param.shape, generator=torch.Generator().manual_seed(seed), dtype=param.dtype)
    c[0, 0] = math.nan if nan else c[0, 0]
    param.grad = None
    return bal.backward({"a": (c[0] * param).sum(), "b": (c[1] * param).sum()}, param)


@pytest.fixture
def no_gramian_kernel(monkeypatch):
    monkeypatch.setattr(gramian_module, "gramian_kernel", lambda: None)  # torch.mm: these tests build nothing


def test_large_float32_cpu_blocks_take_the_kernel_with_s_prime_kept(monkeypatch, no_gramian_kernel):
    fake = Fake()
    monkeypatch.setattr(excess_mtl, "excess_kernel", lambda: fake)
    large = torch.nn.Parameter(torch.randn(KERNEL_MIN_NUMEL // 2))
    bal = ExcessMTL(["a", "b"], [large])
    one_step(large, bal, 0)
    spare, committed = bal.aggregator._spares["sq_grad_sum_0"], bal.aggregator.sq_grad_sum_0
    one_step(large, bal, 1)
    assert fake.calls == [(2, KERNEL_MIN_NUMEL // 2)] * 2
    # S' written into a kept buffer that becomes S, S the next S' buffer: no fresh T x P tensor, no copy per step
    assert bal.aggregator._spares["sq_grad_sum_0"] is committed and bal.aggregator.sq_grad_sum_0 is spare
    before = bal.aggregator.sq_grad_sum_0.clone()
    one_step(large, bal, 2, nan=True)  # not finite: the step is not kept, S stays (and stays S)
    assert (
        bal.aggregator.sq_grad_sum_0 is spare
        and torch.equal(bal.aggregator.sq_grad_sum_0, before)
        and bal.aggregator._spares["sq_grad_sum_0"] is committed
    )
    for param in [
        torch.nn.Parameter(torch.randn(100)),  # small
        torch.nn.Parameter(torch.randn(KERNEL_MIN_NUMEL // 2, dtype=torch.float64)),  # not float32
    ]:
        one_step(param, ExcessMTL(["a", "b"], [param]))
    monkeypatch.setattr(excess_mtl, "world_size", lambda: 2)  # DDP: its squares are averaged over the ranks first
    assert bal.aggregator._kernel_excess(0, torch.randn(2, KERNEL_MIN_NUMEL // 2), None, {}) is None
    assert len(fake.calls) == 3


def test_without_a_kernel_torch_computes_it_and_it_is_said_once(monkeypatch, caplog, no_gramian_kernel):
    monkeypatch.setattr(excess_mtl.cpp_kernels, "build", lambda *args: (None, "RuntimeError: Ninja is required"))
    monkeypatch.setattr(excess_mtl.cpp_kernels, "_said", set())
    large = torch.nn.Parameter(torch.zeros(KERNEL_MIN_NUMEL // 2))
    with caplog.at_level(logging.WARNING, logger="mtl_bench"):
        bal = ExcessMTL(["a", "b"], [large], warmup_steps=2)
        first = one_step(large, bal, 0)
        one_step(large, bal, 1)
    c = torch.randn(2, KERNEL_MIN_NUMEL // 2, generator=torch.Generator().manual_seed(0))
    _, terms = torch_path(c, torch.zeros_like(c), None)
    torch.testing.assert_close(torch.stack([first["excess_mtl/excess/a"], first["excess_mtl/excess/b"]]), terms.sum(1))
    said = [r.getMessage() for r in caplog.records if "excess-risk kernel" in r.getMessage()]
    assert said == [
        "ExcessMTL: the C++ excess-risk kernel cannot be built here (RuntimeError: Ninja is required); "
        "torch computes it"
    ]


def test_the_kernel_is_built_with_the_balancer_when_its_blocks_will_take_it(monkeypatch, no_gramian_kernel):
    built = []
    monkeypatch.setattr(excess_mtl, "excess_kernel", lambda: built.append(1))
    ExcessMTL(["a", "b"], [torch.nn.Parameter(torch.zeros(100))])  # small blocks: torch, nothing to build
    ExcessMTL(["a", "b"], [torch.nn.Parameter(torch.zeros(KERNEL_MIN_NUMEL // 2, dtype=torch.float64))])
    assert built == []
    ExcessMTL(["a", "b"], [torch.nn.Parameter(torch.zeros(KERNEL_MIN_NUMEL // 2))])  # 2 x 2^19 floats: the kernel
    assert built == [1]
    monkeypatch.setattr(excess_mtl, "world_size", lambda: 2)
    ExcessMTL(["a", "b"], [torch.nn.Parameter(torch.zeros(KERNEL_MIN_NUMEL // 2))])  # DDP: the torch path
    assert built == [1]
