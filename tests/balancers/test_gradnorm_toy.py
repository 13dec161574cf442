"""GradNorm's own result (Chen et al. 2018, sec. 4, Figure 3) on the T=10 toy, and the helpers that read it."""

from __future__ import annotations

import json

import pytest

from mtl_bench.analysis.runs import find_runs, spearman
from mtl_bench.engine.recipe import train

SIGMAS = [48.0, 3.0, 54.0, 16.0, 9.0, 30.0, 52.0, 26.0, 47.0, 81.0]


def test_spearman_of_known_orders():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)  # 1 - 6*2/(4*15)


def test_find_runs_keeps_completed_runs_only(tmp_path):
    for name, status in (("a", "completed"), ("b", "failed")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps({"status": status, "overrides": ["seed=1"]}))
    runs = find_runs(tmp_path)
    assert [r.path.name for r in runs] == ["a"] and runs[0].overrides == {"seed": "1"}


@pytest.mark.slow
def test_gradnorm_beats_equal_weights_and_weights_order_inversely_to_sigma(compose_cfg, tmp_path):
    results = {}
    for experiment in ("gradnorm_toy", "gradnorm_toy_equal"):
        conf = compose_cfg(f"experiment={experiment}", "trainer.max_steps=1500", "trainer.eval_every=1500")
        results[experiment] = train(conf, tmp_path / experiment)
    assert (
        results["gradnorm_toy"].summary["test_loss_ratio_sum"]
        < results["gradnorm_toy_equal"].summary["test_loss_ratio_sum"]
    )
    import torch

    state = torch.load(tmp_path / "gradnorm_toy" / "checkpoints" / "last.pt", weights_only=True)["balancer"]
    weights = state["weights"].tolist()  # tasks t0..t9 in sorted order, which is the sigma order here
    assert spearman(SIGMAS, weights) < -0.9
