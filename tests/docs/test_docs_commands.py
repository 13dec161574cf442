"""Every `mtl-bench train` command in README.md and docs/*.md composes and passes the checks a run starts with
(every key against its class), with the base install; every `mtl-bench study` command's study keys load and pass the
study's checks; every `mtl-bench report` flag exists; docs/pareto_front.md's commands run as written, shortened,
in order, its report reading the runs its train commands made (slow)."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import pytest

from tests.docs.test_readme import README, REPO, bash_commands
from tests.helpers.cli import run_cli

PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
# Hydra's flags that take a value, and flags that print instead of training.
VALUE_FLAGS = ("--config-dir", "-cd", "--config-name", "-cn", "--cfg", "-c", "--package", "-p")


def train_commands() -> list[tuple[str, list[str]]]:
    """(page, overrides) of each `mtl-bench train` command; a user's own package (--config-dir, `_target_=my_lab...`)
    is tests/integration/test_bring_your_own.py's, and a sweep is checked at its first value."""
    found = []
    for page in PAGES:
        for words in bash_commands(page.read_text()):
            if words[:2] != ["mtl-bench", "train"] or "--config-dir" in words or "--help" in words:
                continue
            args, skip = [], False
            for word in words[2:]:
                if skip:
                    skip = False
                elif word in VALUE_FLAGS:
                    skip = True
                elif "=" in word and not word.startswith("-"):  # an override (`<sweep dir>` placeholders aside)
                    args.append(word)
            targets = [a.split("=", 1)[1] for a in args if "._target_=" in a]
            if all(t.startswith(("mtl_bench.", "torch.")) for t in targets):  # not a user's own class
                found.append((page.name, args))
    return found


def first_values(overrides: list[str]) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [
        f"{text.split('=', 1)[0]}={next(o.sweep_string_iterator())}" if o.is_sweep_override() else text
        for text, o in zip(overrides, parsed)
    ]


COMMANDS = train_commands()


def test_the_docs_have_train_commands():
    assert len(COMMANDS) > 40 and {page for page, _ in COMMANDS} >= {"README.md", "pareto_front.md", "qm9.md"}


@pytest.mark.parametrize(("page", "overrides"), COMMANDS, ids=[f"{p}:{' '.join(o)[:60]}" for p, o in COMMANDS])
def test_every_train_command_of_the_docs_composes_and_passes_the_checks(page, overrides):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher") if "hydra/launcher" in " ".join(overrides) else None
    from mtl_bench.api import compose_config
    from mtl_bench.engine.compose import finalise_config

    typed = first_values([o for o in overrides if not o.startswith("hydra")])
    cfg = compose_config(typed)
    finalise_config(cfg, typed)


def commands_of(command: str) -> list[tuple[str, list[str]]]:
    """(page, arguments after `mtl-bench <command>`) of each such command in the README and docs."""
    return [
        (page.name, words[2:])
        for page in PAGES
        for words in bash_commands(page.read_text())
        if words[:2] == ["mtl-bench", command]
    ]


STUDIES = [(page, args) for page, args in commands_of("study") if not args[0].endswith(".yaml")]  # a user's file
REPORTS = commands_of("report")


def test_the_docs_have_study_and_report_commands():
    assert len(STUDIES) >= 5 and len(REPORTS) >= 8


@pytest.mark.parametrize(("page", "args"), STUDIES, ids=[f"{p}:{' '.join(a)[:60]}" for p, a in STUDIES])
def test_every_study_command_of_the_docs_loads_and_passes_the_study_checks(page, args):
    from mtl_bench.study.spec import load_study

    load_study(args[0], [a for a in args[1:] if not a.lstrip("+~").startswith("hydra")])


@pytest.mark.parametrize(("page", "args"), REPORTS, ids=[f"{p}:{' '.join(a)[:60]}" for p, a in REPORTS])
def test_every_report_flag_of_the_docs_exists(page, args):
    options = report_options()
    assert "--plots" in options
    assert [a for a in args if a.startswith("-") and a.split("=", 1)[0] not in options] == []


@functools.lru_cache(maxsize=1)
def report_options() -> frozenset[str]:
    """The flags `mtl-bench report --help` lists (asked once for every command of the docs)."""
    result = run_cli("report", "--help")
    assert result.returncode == 0
    return frozenset(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", result.stdout))


SHORT = {"trainer.max_steps": "4", "trainer.front.rays": "3"}  # digits: 3 tasks, the lattice of 3 rays
FAST = ["trainer.eval_every=4", "tasks.n_train=256", "tasks.n_val=64", "tasks.n_test=64"]


@pytest.mark.slow  # three short front runs and the report (~30 s on a busy 2-core machine)
def test_the_pareto_front_commands_run_as_written(tmp_path):
    for words in bash_commands((REPO / "docs" / "pareto_front.md").read_text()):
        if words[0] != "mtl-bench":
            continue
        args = words[1:]
        if args[0] == "train":
            args = [a for a in args if a.split("=", 1)[0] not in SHORT] + [f"{k}={v}" for k, v in SHORT.items()]
            args += FAST
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode == 0, f"{shlex.join(words)}\n{result.stderr[-2000:]}"
        if args[0] == "report":
            assert re.search(r"hypervolume", result.stdout), result.stdout
            plots = Path(tmp_path, args[args.index("--plots") + 1])
            assert list(plots.glob("fronts_*.png"))
