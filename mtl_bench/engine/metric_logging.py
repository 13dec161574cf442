"""The run's loggers (`logger:`) and its console as a loop callback: hparams at the start of a run, the scalars of
each log step and each evaluation, the evaluations' log lines, the progress bar or lines, the final summary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from mtl_bench import tags
from mtl_bench.engine.builders import build, node_dict
from mtl_bench.engine.callbacks import Callback
from mtl_bench.engine.evaluate import log_metrics, loss_ratio_sum
from mtl_bench.engine.progress import Progress
from mtl_bench.loggers import Logger, Loggers, RunInfo
from mtl_bench.loggers.hparams import hparam_values

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import Metrics, Recipe, TrainResult
    from mtl_bench.engine.step import StepResult


class MetricLogging(Callback):
    """Rank 0 opens each node under `logger:` (none: the console only) as `run.logger`, which other callbacks
    log through too; every rank keeps its progress display (a bar only where `run.bar`)."""

    def setup(self, run: Recipe) -> None:
        if run.is_main:
            run.logger = open_loggers(run)
            if run.step == 0:
                config = OmegaConf.to_container(run.cfg, resolve=True)
                values = hparam_values(config, run.choices)  # type: ignore[arg-type]
                final = [tags.metric("test", t, m) for t, names in run.metric_names.items() for m in names]
                run.logger.log_hparams(values, final + [tags.TEST_LOSS_RATIO_SUM])

    def on_fit_start(self, run: Recipe) -> None:
        self.progress = Progress(run.total_steps, run.step, run.bar)

    def on_step_end(self, run: Recipe, result: StepResult, logging_now: bool) -> None:
        if not logging_now:
            self.progress.update(run.step)

    def on_log(self, run: Recipe, scalars: dict[str, float], losses: dict[str, float], rate: float) -> None:
        if run.logger is not None:
            run.logger.log_scalars(scalars, run.step)
        self.progress.update(run.step, losses, rate)

    def on_eval(self, run: Recipe, split: str, metrics: Metrics) -> None:
        log_metrics(run.step, split, metrics)
        if run.logger is not None:
            scalars = {tags.metric(split, t, name): v for t, values in metrics.items() for name, v in values.items()}
            run.logger.log_scalars(scalars, run.step)
            run.logger.flush()

    def on_loop_end(self, run: Recipe) -> None:
        if hasattr(self, "progress"):
            self.progress.close()

    def on_fit_end(self, run: Recipe, result: TrainResult) -> None:
        if run.logger is not None:
            run.logger.log_scalars({tags.TEST_LOSS_RATIO_SUM: loss_ratio_sum(result.test, run.initial_test)}, run.step)

    def teardown(self, run: Recipe) -> None:
        if run.logger is not None:
            run.logger.close()
            run.logger = None


def open_loggers(run: Recipe) -> Logger:
    """Each node under `logger:` (none: nothing is logged but the console), as one."""
    info = RunInfo(run.run_dir, run.step or None, run.metric_names, run.choices.get("tasks"))
    nodes = node_dict(run.cfg.logger) if run.cfg.get("logger") else {}
    loggers: list[Logger] = []
    try:
        for name, node in nodes.items():
            loggers.append(build(f"logger.{name}", node, run=info))  # a Logger, or a class with its methods
    except BaseException:
        Loggers(loggers).close()  # those already open
        raise
    return Loggers(loggers)
