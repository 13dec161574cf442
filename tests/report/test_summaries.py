"""The end-of-run summary (format_run_summary) and the end-of-sweep summary (a Hydra callback)."""

from __future__ import annotations

import json
from pathlib import Path

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from mtl_bench.records import RunRecord
from mtl_bench.report.run_summary import format_run_summary
from mtl_bench.report.sweep_callback import SweepSummary

RECORD = RunRecord.from_dict(
    {
        "status": "completed",
        "step": 400,
        "wall_time_s": 2.0,
        "test": {"depth": {"loss": 0.5, "abs_err": 0.61234}, "segmentation": {"loss": 1.2, "miou": 0.25}},
        "model_selection": "final step",
    }
)


def test_run_summary_names_metrics_weights_time_and_where_to_look(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "my run"
    writer = SummaryWriter(str(run))
    for step, (a, b) in enumerate([(1.0, 1.0), (0.7, 1.3)], start=1):
        writer.add_scalar("weight/depth", a, 10 * step)
        writer.add_scalar("weight/segmentation", b, 10 * step)
    writer.close()
    text = format_run_summary(RECORD, run)
    assert "run finished: 400 steps in 2.0 s (5 ms/step)" in text
    assert "depth         loss 0.5  abs_err 0.6123" in text and "segmentation  loss 1.2  miou 0.25" in text
    assert "final loss weights: depth 0.7, segmentation 1.3" in text  # the last logged, not the first
    assert f"run dir: {run}" in text and f"tensorboard --logdir '{run}'" in text


def test_run_summary_without_weights_says_so(tmp_path):
    assert "final loss weights: none logged" in format_run_summary(RECORD, tmp_path)
    assert "final loss weights: depth 2" in format_run_summary(
        RunRecord.from_dict({**RECORD.to_dict(), "weights": {"depth": 2.0}}), tmp_path
    )


def write_run(root: Path, name: str, balancer: str, seed: int, mse: float) -> None:
    run = root / name
    run.mkdir(parents=True)
    metrics = {
        "status": "completed",
        "overrides": [f"balancer={balancer}", f"seed={seed}"],
        "choices": {"balancer": balancer, "tasks": "toy"},
        "higher_is_better": {"a": {"loss": False, "mse": False}},
        "test": {"a": {"loss": mse, "mse": mse}},
    }
    (run / "metrics.json").write_text(json.dumps(metrics))


def test_the_sweep_callback_is_registered_and_prints_the_compact_report(tmp_path, capsys):
    with initialize_config_module("conf", version_base=None):
        cfg = compose("config", return_hydra_config=True, overrides=[f"hydra.sweep.dir={tmp_path}"])
    callback = cfg.hydra.callbacks.sweep_summary
    assert callback._target_ == "mtl_bench.report.sweep_callback.SweepSummary"
    for seed in (0, 1):
        write_run(tmp_path, f"f{seed}", "fixed", seed, 1.0 + seed)
        write_run(tmp_path, f"g{seed}", "gradnorm", seed, 0.5 + seed)
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    out = capsys.readouterr().out
    assert f"sweep finished: {tmp_path}" in out and "best by mean rank: balancer=gradnorm" in out
    assert max(len(line) for line in out.splitlines() if str(tmp_path) not in line) <= 100  # paths are not cut


def test_a_sweep_with_nothing_to_report_says_so_in_one_line(tmp_path, capsys):
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "none")}}}))
    out = capsys.readouterr().out
    assert "no report for" in out and "does not exist" in out
