"""Each architecture through the engine: a short run of the default experiment completes, and the same seed gives
the same numbers (DSelect-k's in-forward regulariser and the gates included)."""

from __future__ import annotations

import json

import pytest

from mtl_bench.engine.recipe import train

SMALL = ["trainer=smoke", "tasks.n_train=256", "tasks.n_val=32", "tasks.n_test=32", "model.widths=[16,16]"]


@pytest.mark.parametrize("arch", ["mmoe", "cgc", "ple", "dselect_k", "cross_stitch"])
def test_each_architecture_trains_through_the_engine(compose_cfg, tmp_path, arch):
    cfg = compose_cfg(*SMALL, f"model/arch={arch}", "seed=5")
    a = train(cfg, tmp_path / "a")
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["step"] == 20
    if arch in ("dselect_k", "cross_stitch"):
        b = train(compose_cfg(*SMALL, f"model/arch={arch}", "seed=5"), tmp_path / "b")
        assert a.test == b.test and a.val == b.val
