"""benchmarks.peers: LibMTL loaded from its files, or a clear error naming the extra."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks import peers


def test_a_missing_libmtl_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(__import__("sys").modules, "LibMTL", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install -e '\.\[peers\]'") as info:
        peers.libmtl_root()
    assert info.value.name == "LibMTL"


def test_a_weighting_loads_from_the_installed_files() -> None:
    try:  # the loader's own lookup (find_spec fails once another test put the loader's stand-in package in place)
        peers.libmtl_root()
    except ModuleNotFoundError:
        pytest.skip("LibMTL (the peers extra) is not installed")
    cls = peers.load_libmtl("EW")
    assert cls.__name__ == "EW" and cls.__module__ == "LibMTL.weighting.EW"
