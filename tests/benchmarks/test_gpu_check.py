"""scripts/gpu_check.py: its reduced form runs on the CPU (so it cannot rot) without touching docs/gpu.md, bad
arguments stop with one line, and on a GPU machine (`pytest -m cuda`) each section passes at the reduced sizes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_script(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cpu", "--only", "balancers,nope"], "--only: unknown section(s) ['nope']"),
        (["--device", "tpu"], "--device: 'tpu' is not cuda, cuda:N or cpu"),
    ],
)
def test_bad_arguments_stop_with_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        load_script().main(args)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_cpu_form_writes_elsewhere_than_docs_gpu_md():
    script = load_script()
    assert script.default_output(torch.device("cpu")) != ROOT / "docs" / "gpu.md"
    assert script.default_output(torch.device("cuda", 0)) == ROOT / "docs" / "gpu.md"


@pytest.mark.slow
def test_the_reduced_form_passes_on_the_cpu(tmp_path):
    gpu_md = ROOT / "docs" / "gpu.md"
    before = gpu_md.read_bytes() if gpu_md.exists() else None
    report = tmp_path / "report.md"
    done = run_script("--device", "cpu", "--output", str(report))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = report.read_text()
    assert "- result: PASS" in text
    script = load_script()
    for title in script.TITLES.values():
        assert f"## {title}" in text
    assert (gpu_md.read_bytes() if gpu_md.exists() else None) == before


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["balancers", "bench", "compile", "qm9", "segnet", "ddp"])
def test_each_section_passes_on_the_gpu(tmp_path, name):
    script = load_script()
    section = script.Section(script.TITLES[name])
    script.CHECKS[name](script.Check(torch.device("cuda", 0), reduced=True, root=tmp_path), section)
    assert not section.failures, section.failures
    assert section.lines
