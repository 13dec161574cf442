"""`mtl-bench --version`: the package's version and the torch it runs on, from the installed metadata."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

from typer.testing import CliRunner

from mtl_bench.cli import app


def test_version_names_the_package_and_torch() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"mtl-bench {version('mtl-bench')} (torch {version('torch')})"


def test_version_does_not_import_torch() -> None:
    code = (
        "import sys; from typer.testing import CliRunner; from mtl_bench.cli import app; "
        "r = CliRunner().invoke(app, ['--version']); print(r.exit_code, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "False"]
