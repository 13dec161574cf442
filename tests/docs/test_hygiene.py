"""The repository's text files keep two house rules: no line over 120 characters (ruff's line length, for prose,
tables and configs too) and no issue numbers (a reader of a file should not need the tracker to follow it)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("README.md", "docs", "mtl_bench", "conf", "scripts", "benchmarks", "tests", "pyproject.toml", ".ci")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cpp", ".txt", ""}
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)


def text_files() -> list[Path]:
    found = []
    for root in ROOTS:
        path = REPO / root
        for file in [path] if path.is_file() else sorted(path.rglob("*")):
            if file.is_file() and file.suffix in SUFFIXES and "__pycache__" not in file.parts:
                found.append(file)
    return found


def lines_where(predicate) -> list[str]:  # type: ignore[no-untyped-def]
    hits = []
    for file in text_files():
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{file.relative_to(REPO)}:{n}" for n, line in enumerate(text.splitlines(), 1) if predicate(line)]
    return hits


def test_the_walk_sees_the_docs_code_and_configs():
    names = {file.relative_to(REPO).as_posix() for file in text_files()}
    assert {"README.md", "docs/benchmarks.md", "mtl_bench/engine/recipe.py", "conf/config.yaml"} <= names


def test_no_line_is_over_120_characters():
    assert lines_where(lambda line: len(line) > 120) == []


def test_no_issue_numbers():
    assert lines_where(lambda line: ISSUE_NUMBER.search(line) is not None and "ISSUE_NUMBER" not in line) == []
