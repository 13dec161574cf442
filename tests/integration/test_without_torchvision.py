"""torchvision is imported only by the parts that need it: `--help`, the default `train` (MLP) and `report` run
with torchvision not importable, and a part that needs it fails in one line naming the install command.

Each command runs in a fresh process whose `sitecustomize` puts a finder first on `sys.meta_path` that makes
`import torchvision` (and its submodules) raise ImportError, as on a machine without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BLOCKER = """
import sys


class NoTorchvision:
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            raise ImportError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, NoTorchvision())
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    hook = tmp_path_factory.mktemp("no_torchvision")
    (hook / "sitecustomize.py").write_text(BLOCKER)
    repo = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (str(hook), repo, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def run(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_the_hook_blocks_torchvision(env: dict[str, str]) -> None:
    result = run(env, sys.executable, "-c", "import torchvision")
    assert result.returncode != 0 and "blocked by the test" in result.stderr


def test_importing_the_models_and_task_sets_does_not_import_torchvision(env: dict[str, str]) -> None:
    code = "import sys, mtl_bench.models, mtl_bench.tasks, mtl_bench.cli; print('torchvision' in sys.modules)"
    result = run(env, sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_help_default_train_and_report_work_without_torchvision(env: dict[str, str], tmp_path: Path) -> None:
    cli = (sys.executable, "-m", "mtl_bench")
    assert run(env, *cli, "--help").returncode == 0
    run_dir = tmp_path / "run"
    trained = run(env, *cli, "train", "trainer.max_steps=3", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (run_dir / "metrics.json").is_file()
    reported = run(env, *cli, "report", str(run_dir), "--format", "csv", cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr[-2000:]
    assert "t0" in reported.stdout


@pytest.mark.parametrize(
    "overrides, needed_by",
    [
        (["model=resnet18"], "ResNet18 (model=resnet18)"),
        pytest.param(["experiment=celeba_cnn"], "CelebA (tasks=celeba)", marks=pytest.mark.slow),
        pytest.param(["tasks=office31", "tasks.root=."], "tasks=office31", marks=pytest.mark.slow),
        pytest.param(["model=resnet_dilated"], "model=resnet_dilated", marks=pytest.mark.slow),
    ],
)
def test_a_part_that_needs_torchvision_fails_in_one_line_naming_the_install(
    env: dict[str, str], tmp_path: Path, overrides: list[str], needed_by: str
) -> None:
    result = run(env, sys.executable, "-m", "mtl_bench", "train", *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    assert "pip install torchvision" in lines[-1] and needed_by in lines[-1], result.stderr[-2000:]
