"""The custom-scalars layout groups per-task tags by family, whatever the balancer logs."""

from __future__ import annotations

import re

from mtl_bench.loggers.tensorboard import dashboard_layout


def _chart_matching(layout: dict, tag: str) -> list[str]:
    return [
        title
        for charts in layout.values()
        for title, (_, patterns) in charts.items()
        if any(re.search(p, tag) for p in patterns)
    ]


def test_each_per_task_family_gets_one_chart_with_all_tasks():
    tags = [
        "loss/a",
        "loss/b",
        "weight/a",
        "weight/b",
        "gradnorm/target/a",
        "gradnorm/target/b",
        "gradnorm/L_grad",
        "grad_norm/total",
        "grad_norm/a",
        "grad_norm/b",
        "lr/0",
        "perf/steps_per_s",
    ]
    layout = dashboard_layout({"a": ["loss", "mse"], "b": ["loss", "accuracy"]}, tags)
    assert (
        _chart_matching(layout, "gradnorm/target/a")
        == _chart_matching(layout, "gradnorm/target/b")
        == ["gradnorm/target (all tasks)"]
    )
    # a tag that is not per task gets its own chart, not the per-task family's
    assert _chart_matching(layout, "grad_norm/total") == ["grad_norm/total"]
    assert _chart_matching(layout, "grad_norm/a") == ["grad_norm (all tasks)"]
    assert _chart_matching(layout, "gradnorm/L_grad") == ["gradnorm/L_grad"]
    assert _chart_matching(layout, "metric/val/b/accuracy") == ["val accuracy (all tasks)"]
    assert _chart_matching(layout, "lr/0") == ["learning rate"]
