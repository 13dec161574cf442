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


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`mtl-bench ...` run in this process (no interpreter start, no torch import: a few hundred ms instead of
    10-15 s), with what it prints and its exit status as `cli` returns them. The logging that Hydra's job set up
    (handlers on the root logger, its level) is put back afterwards, so later tests log as before."""
    import contextlib
    import io
    import logging

    from mtl_bench.cli import app

    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    previous = Path.cwd()
    code: int | str | None = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                app([*args], prog_name="mtl-bench")
            except SystemExit as exit_:
                code = exit_.code
    finally:
        os.chdir(previous)
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
    returncode = code if isinstance(code, int) else (0 if code is None else 1)
    return subprocess.CompletedProcess(["mtl-bench", *args], returncode, out.getvalue(), err.getvalue())
