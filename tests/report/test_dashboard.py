"""TensorBoard output of a sweep, read back from the event files: tags, the custom-scalars layout and the
HParams tab (each run's overrides and final metrics)."""

from __future__ import annotations

import re
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2
from typer.testing import CliRunner

from mtl_bench.cli import app

SMOKE = ["trainer=smoke", "tasks.n_train=512", "tasks.n_val=64", "tasks.n_test=64"]


def events_of(run: Path) -> EventAccumulator:
    events = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def plugin_content(events: EventAccumulator, plugin: str, tag: str) -> bytes:
    return events.PluginTagToContent(plugin)[tag]


def test_sweep_dashboard(tmp_path):
    result = CliRunner().invoke(app, ["train", "-m", "balancer=fixed,gradnorm", f"hydra.sweep.dir={tmp_path}", *SMOKE])
    assert result.exit_code == 0, result.output
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [r.name.split(",")[0] for r in runs] == ["0_balancer=fixed", "1_balancer=gradnorm"]  # readable names

    for run, balancer in zip(runs, ["fixed", "gradnorm"]):
        events = events_of(run)
        tags = set(events.Tags()["scalars"])
        assert {"loss/t0", "loss/t1", "weight/t0", "weight/t1", "metric/test/t0/mse", "metric/test/t1/mse"} <= tags

        # HParams: the chosen options and their values (no Hydra keys), and the final test metrics as the columns
        start = plugin_data_pb2.HParamsPluginData.FromString(
            plugin_content(events, "hparams", "_hparams_/session_start_info")
        ).session_start_info
        assert start.hparams["balancer"].string_value == balancer
        assert not [key for key in start.hparams if key.endswith(("_target_", "_partial_")) or key.startswith("hydra")]
        experiment = plugin_data_pb2.HParamsPluginData.FromString(
            plugin_content(events, "hparams", "_hparams_/experiment")
        ).experiment
        columns = {m.name.tag for m in experiment.metric_infos}
        assert {"metric/test/t0/mse", "metric/test/t1/mse", "summary/test_loss_ratio_sum"} <= columns
        assert columns <= tags  # every column has its value in this run

        # custom scalars: one chart per family holding every task, matched by its regex
        (config,) = events.Tensors("custom_scalars__config__")  # the layout is the tensor's one string
        layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
        charts = {chart.title: chart.multiline.tag for category in layout.category for chart in category.chart}
        for family in ("loss", "weight"):
            (patterns,) = [p for title, p in charts.items() if title.startswith(family + " ")]
            assert all(any(re.fullmatch(pattern, f"{family}/{t}") for pattern in patterns) for t in ("t0", "t1"))
        if balancer == "gradnorm":
            assert any(title.startswith("gradnorm/norm_share ") for title in charts)  # its share of weighted norms
            assert any(title.startswith("grad_norm ") for title in charts)
