"""The two run-level pieces a study needs from the engine: `trainer.only_tasks` (a single-task baseline: the same
model with one head) and peak memory in metrics.json."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtl_bench.engine.compose import build_model, build_tasks
from mtl_bench.engine.memory import peak_memory
from mtl_bench.errors import ConfigError
from mtl_bench.records import RunRecord
from mtl_bench.report.run_summary import format_run_summary, memory_text


def test_only_tasks_keeps_one_task_its_head_and_targets(compose_cfg):
    cfg = compose_cfg("experiment=toy10", "tasks.n_train=64", "tasks.n_val=16", "tasks.n_test=16")
    cfg.trainer.only_tasks = ["t3"]
    conf = OmegaConf.to_object(cfg.trainer)
    taskset = build_tasks(cfg, conf, torch.device("cpu"))
    assert taskset.task_names == ["t3"] and list(taskset.train.targets) == ["t3"]
    model = build_model(cfg, taskset, torch.device("cpu"))
    assert list(model.heads) == ["t3"]
    cfg.trainer.only_tasks = ["t3", "t42"]
    with pytest.raises(ConfigError, match=r"^trainer.only_tasks=\[t3,t42\]: name one or more of the tasks t0, t1"):
        build_tasks(cfg, OmegaConf.to_object(cfg.trainer), torch.device("cpu"))


def test_peak_memory_on_cpu_is_the_process_peak_rss_labelled_so():
    peak = peak_memory(torch.device("cpu"))
    assert peak is not None and peak["kind"] == "cpu_peak_rss" and peak["label"] == "CPU process peak RSS"
    with open("/proc/self/status") as f:  # VmHWM: the kernel's own peak resident set size, in kB
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    assert peak["bytes"] == pytest.approx(hwm * 1024, rel=0.05)
    assert memory_text(peak).endswith("MiB (CPU process peak RSS)")
    text = format_run_summary(RunRecord.from_dict({"test": {}, "peak_memory": peak, "weights": {"a": 1.0}}), Path("."))
    assert "peak memory: " in text
