"""Every code fence in README.md and docs/*.md is balanced and names its language, so no page renders its prose as
code (or its code as prose). The fences are read by markdown-it-py, a CommonMark parser: a fence left open runs to
the end of the page, and a fence without a language is where a missing opening fence shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def closes(line: str, markup: str) -> bool:
    """Whether `line` closes a block opened by `markup` (the same character, at least as many, nothing after)."""
    found = FENCE.match(line)
    return (
        found is not None
        and found.group(1)[0] == markup[0]
        and len(found.group(1)) >= len(markup)
        and (line[found.end() :].strip() == "")
    )


def fence_problems(text: str) -> list[str]:
    """One line per fence that is not closed or has no language, and per fence opening inside another block
    (```python within a block: the block before it was not closed where it was meant to be)."""
    lines = text.splitlines()
    problems = []
    for token in MarkdownIt("commonmark").parse(text):
        if token.type != "fence" or token.map is None:
            continue
        start, end = token.map  # lines [start, end) of the block, its fences included
        if not token.info.strip():
            problems.append(f"line {start + 1}: a fence without a language")
        if end - 1 == start or not closes(lines[end - 1], token.markup):
            problems.append(f"line {start + 1}: a fence never closed")
        for i in range(start + 1, end - 1):
            found = FENCE.match(lines[i])
            if found and found.group(1)[0] == token.markup[0] and len(found.group(1)) >= len(token.markup):
                problems.append(f"line {i + 1}: a fence with a language inside the block opened at line {start + 1}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_fence_is_closed_and_names_its_language(page: Path):
    assert fence_problems(page.read_text()) == [], page.relative_to(REPO)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("a\n\n```python\nx = 1\n```\n", None),
        ("a\n\n```\nx = 1\n```\n", "line 3: a fence without a language"),
        ("a\n\n```python\nx = 1\n", "line 3: a fence never closed"),
        ("x = 1\n```\n\nmore\n\n```python\ny\n```\n", "line 2: a fence without a language"),
        ("```text\nx\n```python\ny\n```\n", "line 3: a fence with a language inside the block opened at line 1"),
        ("````markdown\n```python\nx\n```\n````\n", None),  # a longer fence may hold a shorter one
    ],
)
def test_the_check_finds_each_kind_of_broken_fence(text: str, problem: str | None):
    found = fence_problems(text)
    assert (problem in found) if problem else found == []
