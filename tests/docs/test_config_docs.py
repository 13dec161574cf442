"""docs/configuration.md is written from the options' declarations, so it cannot drift from them."""

from __future__ import annotations

import runpy
from pathlib import Path

from mtl_bench.config import keys_where

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_page_equals_what_the_script_writes():
    script = runpy.run_path(str(REPO / "scripts" / "config_docs.py"))
    assert (REPO / "docs" / "configuration.md").read_text() == script["page"](), "run python scripts/config_docs.py"


def test_the_page_lists_every_option_and_its_resume_fact():
    text = (REPO / "docs" / "configuration.md").read_text()
    assert "- `trainer.max_steps` (default `1000`; may change on resume)" in text
    assert "- `trainer.batch_size` (default `128`; fixed on resume)" in text
    for key in keys_where("resumable"):
        assert f"`{key}`" in text
    assert max(len(line) for line in text.splitlines()) <= 120
