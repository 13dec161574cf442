"""The wheel ships conf/, and an installed (non-editable) mtl-bench finds it from any directory."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_install_finds_its_packaged_conf(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(dist.glob("mtl_bench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for expected in (
        "mtl_bench/conf/config.yaml",
        "mtl_bench/conf/optim/adam.yaml",
        "mtl_bench/conf/hydra/job_logging/rich.yaml",
        "mtl_bench/cli.py",
        "mtl_bench/report/published/nash_mtl.yaml",  # the published rows ship as package data
        "mtl_bench/cpp/gramian_cpu.cpp",  # the C++ kernels' sources, built at first use
        "mtl_bench/cpp/README.md",
    ):
        assert expected in names, expected
    # the benchmark helpers (benchmarks/) and the scripts serve a checkout only
    assert not [n for n in names if n.startswith(("benchmarks/", "scripts/", "tests/", "mtl_bench/bench/"))]

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}  # the installed copy shadows the checkout
    info = subprocess.run(
        [sys.executable, "-m", "mtl_bench", "train", "--info", "searchpath"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(site / "mtl_bench" / "conf") in info
    assert str(REPO / "conf") not in info
    job = subprocess.run(
        [sys.executable, "-m", "mtl_bench", "train", "--cfg", "job", "tasks=digits"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "_target_: mtl_bench.tasks.Digits" in job
