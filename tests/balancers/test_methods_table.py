"""docs/methods.md is what scripts/methods_table.py writes from the classes and YAMLs today."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("methods_table", ROOT / "scripts" / "methods_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_page_equals_the_scripts_output():
    pytest.importorskip("cvxpy")  # Nash-MTL builds only with it (the peers extra); its row reads "?" without
    page = (ROOT / "docs" / "methods.md").read_text()
    assert page == load_script().render(), "regenerate: python scripts/methods_table.py > docs/methods.md"


def test_every_option_has_a_row_with_its_test_file():
    script = load_script()
    rows = script.rows()
    options = sorted(p.stem for p in (ROOT / "conf" / "balancer").glob("*.yaml"))
    assert [row["option"] for row in rows] == options
    for row in rows:
        assert (ROOT / "tests" / "balancers" / row["test"]).is_file(), row["option"]
        assert row["kind"] in ("loss weighting", "gradient", "bilevel")


def test_each_reference_is_a_whole_sentence():
    """The `Reference:` sentence is cut at its full stop, not at an abbreviation's ("e.g." in CR-MOGM's)."""
    script = load_script()
    for row in script.rows():
        text = row["reference"]
        assert text.count("(") == text.count(")") and text.count("`") % 2 == 0, (row["option"], text)
        assert not text.endswith(("e.g", "i.e")), (row["option"], text)
    assert "(e.g. `UPGradWeighting`)" in next(r["reference"] for r in script.rows() if r["option"] == "cr_mogm")
