"""The C++ CPU kernels (mtl_bench/cpp_kernels.py, sources in mtl_bench/cpp/) are never chosen for a tensor off the
CPU. Without a GPU this is checked by a fake device dispatch (CPU data whose `device` reads cuda:0, which is all the
selection looks at) and by meta tensors: the selection functions refuse both, and the paths that would call a kernel
compute with torch without building one. The sources sit in one folder, their x86 attributes guarded, and without a
compiler the torch path runs and says so once."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from mtl_bench import cpp_kernels
from mtl_bench.balancers import trimmed_mean
from mtl_bench.balancers.trimmed_mean import block_drop_extremes, drop_extremes
from mtl_bench.gradient_engine.gramian import block_gramian, takes_kernel
from mtl_bench.optim.scaled_adam import ScaledAdam, kernel_takes

TASKS = 4
SHAPE = (512, 512)  # with 4 tasks, 2^20 elements: a block the CPU path hands to its kernel


class FakeCuda(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0; ops on it return FakeCuda (torch's default __torch_function__)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def fake_cuda(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(FakeCuda)


@pytest.fixture
def no_kernel_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(name, *args, **kwargs):
        raise AssertionError(f"the C++ CPU kernel {name} was chosen")

    monkeypatch.setattr(cpp_kernels, "build", refuse)


def test_the_selection_takes_large_float32_cpu_tensors_only():
    cpu = torch.zeros(SHAPE)
    assert takes_kernel(cpu, TASKS) and kernel_takes(cpu)  # else the refusals below would prove nothing
    for off_cpu in (fake_cuda(cpu), torch.zeros(SHAPE, device="meta")):
        assert off_cpu.device.type != "cpu"
        assert not takes_kernel(off_cpu, TASKS)
        assert not kernel_takes(off_cpu)


def test_gramian_and_trim_of_a_cuda_block_go_through_torch(no_kernel_build):
    g = torch.Generator().manual_seed(0)
    block = torch.randn(TASKS, *SHAPE, generator=g)
    rows = block.reshape(TASKS, -1)
    gram = block_gramian(fake_cuda(rows))
    torch.testing.assert_close(gram.as_subclass(torch.Tensor), rows @ rows.T)
    direction, kept = block_drop_extremes(fake_cuda(block))
    want_direction, want_kept = drop_extremes(block)
    assert torch.equal(direction.as_subclass(torch.Tensor), want_direction)
    assert torch.equal(kept.as_subclass(torch.Tensor), want_kept)
    meta = block_gramian(torch.empty(TASKS, SHAPE[0] * SHAPE[1], device="meta"))
    assert meta.device.type == "meta" and meta.shape == (TASKS, TASKS)


def test_scaled_adam_on_meta_parameters_is_eager_without_a_build(no_kernel_build):
    params = [torch.nn.Parameter(torch.empty(SHAPE, device="meta")) for _ in range(2)]
    opt = ScaledAdam(params, lr=0.01)
    assert opt.implementation == "eager"


@pytest.mark.cuda
def test_on_a_real_gpu_no_kernel_is_chosen(no_kernel_build):
    block = torch.randn(TASKS, *SHAPE, device="cuda")
    assert not takes_kernel(block[0], TASKS) and not kernel_takes(block[0])
    rows = block.reshape(TASKS, -1)
    torch.testing.assert_close(block_gramian(rows), rows @ rows.T)
    direction, _ = block_drop_extremes(block)
    assert direction.device.type == "cuda"
    opt = ScaledAdam([torch.nn.Parameter(torch.zeros(SHAPE, device="cuda"))], lr=0.01)
    assert opt.implementation == "eager"


# ----------------------------------------------------------------------------- the folder, the guard, the fallback

SOURCES = sorted(cpp_kernels.SOURCES.glob("*.cpp"))


def test_every_kernel_source_is_in_the_folder_and_its_readme_names_it():
    names = {p.name for p in SOURCES}
    assert names == {"scaled_adam_cpu.cpp", "gramian_cpu.cpp", "trimmed_mean_cpu.cpp", "excess_mtl_cpu.cpp"}
    readme = (cpp_kernels.SOURCES / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in names)
    package = cpp_kernels.SOURCES.parent
    assert [p for p in package.rglob("*.cpp") if p.parent != cpp_kernels.SOURCES] == []


def test_target_clones_is_only_inside_the_x86_guard():
    """GCC/clang's target_clones exists on x86-64 only: outside the guard, an ARM build would fail."""
    for path in SOURCES:
        text = path.read_text()
        guarded = re.search(
            r"#if defined\(__x86_64__\) && defined\(__GNUC__\)\n"
            r"#define MTL_CLONES (__attribute__\(\(target_clones\([^\n]*)\n"
            r"#else\n#define MTL_CLONES\n#endif",
            text,
        )
        assert guarded is not None, path.name
        assert text.count("target_clones(") == 1, path.name  # the one in the guard
        assert "MTL_CLONES" in text.split("#endif", 1)[1], path.name  # the guarded macro is used


def test_without_a_compiler_the_torch_path_runs_and_says_so_once(monkeypatch, tmp_path, caplog):
    """A real build attempt with a 'compiler' that fails (CXX=false, an empty extensions cache): the kernel is None,
    one warning names the error and what computes instead, and TrimmedMean's direction is the torch path's."""
    monkeypatch.setenv("CXX", "false")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_kernels, "_built", {})
    monkeypatch.setattr(cpp_kernels, "_errors", {})
    monkeypatch.setattr(cpp_kernels, "_said", set())
    block = torch.randn(4, 1 << 18, generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING, logger="mtl_bench"):
        first = trimmed_mean.block_drop_extremes(block)
        second = trimmed_mean.block_drop_extremes(block)
    expected = trimmed_mean.drop_extremes(block)
    for got in (first, second):
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    said = [r.getMessage() for r in caplog.records if "cannot be built here" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("TrimmedMean: the C++ trim=1 kernel cannot be built here (")
    assert said[0].endswith("; torch computes it")
