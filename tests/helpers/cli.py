"""The CLI as a user's shell runs it, and the small settings the CLI tests share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# A few steps on a small toy set: enough to run an experiment through, fast.
SMOKE = ["trainer=smoke", "tasks.n_train=512", "tasks.n_val=64", "tasks.n_test=64"]
# The same with a narrower MLP: the engine tests' small run.
SMALL = [*SMOKE, "model.widths=[32,32]"]
# Presets whose task sets read data from disk (tests/integration/test_benchmark_presets.py runs them on tiny trees;
# the QM9 presets need a cache of the whole dataset: tests/integration/test_qm9_cli.py).
ON_DISK = ("nyuv2_", "cityscapes_", "celeba_", "office", "qm9")


def cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m mtl_bench ...` in a fresh process, as a user's shell would."""
    return subprocess.run(
        [sys.executable, "-m", "mtl_bench", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
