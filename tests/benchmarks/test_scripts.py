"""The scripts in scripts/ use the public API: no import from tests/, no private attribute of another object."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))
# bench_optim.py times ScaledAdam's private update paths; its rewrite (one public fast path) is under way apart.
PENDING: set[str] = set()


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(p, marks=pytest.mark.xfail(reason="times private update paths", strict=False))
        if p.name in PENDING
        else p
        for p in SCRIPTS
    ],
    ids=lambda p: p.name,
)
def test_script_uses_only_the_public_api(script: Path) -> None:
    tree = ast.parse(script.read_text())
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests":
            problems.append(f"line {node.lineno}: imports from {node.module}")
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tests" for a in node.names):
            problems.append(f"line {node.lineno}: imports tests")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "torch")):
                problems.append(f"line {node.lineno}: uses the private attribute {node.attr}")
    assert not problems, f"{script.name}: " + "; ".join(problems)


def test_there_are_scripts_to_check() -> None:
    assert len(SCRIPTS) >= 5
