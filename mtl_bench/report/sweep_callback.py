"""The end-of-sweep summary: when `mtl-bench train -m ...` ends, print the compact report of the sweep's runs.

Registered in conf/config.yaml under `hydra.callbacks`; Hydra calls `on_multirun_end` once, on the machine that
launched the sweep, after every job returned (also with the Slurm launcher).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from mtl_bench.report.main import sweep_summary

        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            text = sweep_summary(sweep_dir)
        except Exception as err:  # the sweep's runs are on disk: a summary that fails must not fail the sweep
            text = f"no summary of {sweep_dir}: {type(err).__name__}: {err}\n"
        print(f"\nsweep finished: {sweep_dir}\n{text}", end="", flush=True)
