"""Every shell command in README.md's ```bash blocks is run or checked, so the README cannot drift.

`mtl-bench` commands run in order in one working directory (so the report reads the README's own sweep), with
their length replaced by `trainer=smoke`, their data (`tasks.root=/data/<set>`) replaced by a tiny tree in the
set's real format and their model narrowed. `pip`, `pytest` and `tensorboard` are checked, not run: the extras
and the torch/torchvision pair are those of pyproject.toml and `.ci/run`, the test command is the one CI runs,
the TensorBoard log directory holds the events of the runs above it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from tests.helpers.celeba_tree import write_celeba
from tests.helpers.dense_tree import write_cityscapes, write_nyuv2
from tests.helpers.office_tree import write_office31, write_office_home

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# Lengths a README command may type: replaced by trainer=smoke (typing both max_steps and epochs is an error).
LENGTH_KEYS = ("trainer.max_steps=", "trainer.epochs=")
# The data a command names under /data: a tiny tree of that set and overrides that keep the model small.
DATA: dict[str, tuple[Callable[[Path], Path], list[str]]] = {
    "nyuv2": (lambda root: write_nyuv2(root, n_train=4, n_val=2), ["model.filters=[4,8,8,8,8]"]),
    "cityscapes": (lambda root: write_cityscapes(root, n_train=4, n_val=2), ["model.filters=[4,8,8,8,8]"]),
    "celeba": (lambda root: write_celeba(root, n=6), ["model.channels=[4,4,4,4]", "model.hidden=8"]),
    "office31": (lambda root: write_office31(root, per_class=5), ["tasks.image_size=32"]),
    "office_home": (lambda root: write_office_home(root, per_class=5), ["tasks.image_size=32"]),
}
DATA_SHORT = ["trainer.max_steps=2", "trainer.batch_size=2", "trainer.eval_every=2", "trainer.eval_batch_size=2"]


def bash_commands(markdown: str) -> list[list[str]]:
    """The commands of every ```bash block, as argument lists: comments dropped, `\\` continuations joined."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", markdown, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def pyproject_extras() -> set[str]:
    """The names under [project.optional-dependencies] (tomllib is 3.11+; the project supports 3.10)."""
    section = (REPO / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
    return set(re.findall(r"^(\w+) = \[", section, flags=re.M))


def ci_lines() -> list[str]:
    return [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]


def test_bash_commands_are_parsed_as_a_shell_would():
    text = "x\n```bash\na b   # c\n\nd 'e f' \\\n  g\n```\n```python\nnot_me()\n```\n```bash\nh\n```\n"
    assert bash_commands(text) == [["a", "b"], ["d", "e f", "g"], ["h"]]


def test_every_command_is_one_this_test_knows():
    programs = {words[0] for words in bash_commands(README.read_text())}
    assert programs <= {"mtl-bench", "pip", "pytest", "tensorboard"}, programs


def test_pip_commands_name_extras_pyproject_declares_and_the_torch_pair_ci_installs():
    extras = pyproject_extras()
    ci_pins = {w for line in ci_lines() if line.startswith("python -m pip install") for w in line.split() if "==" in w}
    pips = [words for words in bash_commands(README.read_text()) if words[0] == "pip"]
    assert pips
    for words in pips:
        assert words[1] == "install", words
        for word in words[2:]:
            if match := re.fullmatch(r"\.\[([\w,]+)\]", word):
                assert set(match.group(1).split(",")) <= extras, word
            elif "==" in word:
                assert word in ci_pins, f"{word}: .ci/run installs {sorted(ci_pins)}"
    # The README's extras named in prose (`.[sweep]`, ...) exist too.
    for named in re.findall(r"`\.\[([\w,]+)\]`", README.read_text()):
        assert set(named.split(",")) <= extras, named


def test_the_extras_are_read_from_pyproject():
    assert {"dev", "sweep", "optuna", "peers", "chem"} <= pyproject_extras()


def test_the_readme_test_command_is_the_one_ci_runs():
    tests = [" ".join(words) for words in bash_commands(README.read_text()) if words[0] == "pytest"]
    assert tests == ["pytest"] and "pytest" in ci_lines()


def run_mtl_bench(words: list[str], cwd: Path, data: Path) -> subprocess.CompletedProcess:
    args = words[1:]
    if args[:1] == ["train"] and not {"--help", "--cfg"} & set(args):
        args = [a for a in args if not a.startswith(LENGTH_KEYS)] + ["trainer=smoke"]
        for i, arg in enumerate(args):
            if match := re.fullmatch(r"tasks\.root=/data/(\w+)", arg):
                write, narrow = DATA[match.group(1)]
                args[i] = f"tasks.root={write(data / match.group(1))}"
                args += narrow + DATA_SHORT
    return subprocess.run(
        [sys.executable, "-m", "mtl_bench", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


@pytest.mark.slow  # a dozen CPU processes, ~15 s each on a busy 2-core machine
def test_every_readme_command_runs(tmp_path):
    failures = []
    for words in bash_commands(README.read_text()):
        shown = shlex.join(words)
        if words[0] == "mtl-bench":
            result = run_mtl_bench(words, tmp_path, tmp_path / "data")
            if result.returncode != 0:
                failures.append(f"{shown}\n  exit {result.returncode}: {result.stderr[-2000:]}")
        elif words[0] == "tensorboard":
            logdir = tmp_path / words[words.index("--logdir") + 1]
            if not any(logdir.rglob("events.out.tfevents.*")):
                failures.append(f"{shown}\n  no TensorBoard events under {logdir}")
    assert not failures, "\n".join(failures)


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {
        re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        for title in re.findall(r"^#+ (.*)$", markdown, flags=re.M)
    }


def test_anchors_are_github_style():
    assert anchors("# A b\n## NYUv2\n### Δm, mean rank: `x`\n") == {"a-b", "nyuv2", "δm-mean-rank-x"}


def test_links_to_a_section_name_a_heading_of_that_page():
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md)?#([\w-]+)\)", page.read_text()):
            linked = (page.parent / target) if target else page
            if linked.exists():  # pages other branches add are checked once they are here
                assert anchor in anchors(linked.read_text()), f"{page.name}: {target}#{anchor}"
