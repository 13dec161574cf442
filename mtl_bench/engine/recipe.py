"""One training run as one object: `setup()` builds the parts from config, `train()` runs the loop,
`cleanup()` closes what setup opened. `train(cfg, run_dir)` below does all three and writes metrics.json.
The loop knows steps, evaluations and checkpoints; each run-level feature (front evaluation, diagnostics, logging,
selection, preemption, a user's own) is a callback it calls (engine/callbacks.py); `RunState` (engine/checkpoint.py)
owns what a checkpoint holds."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from mtl_bench.config import TrainerConf
from mtl_bench.engine import distributed as ddp
from mtl_bench.engine.anomalous import report_parameters_outside_graph
from mtl_bench.engine.builders import pick_device
from mtl_bench.engine.checkpoint import RunState, find_checkpoint, load_checkpoint, seed_everything
from mtl_bench.engine.compile import implementation_of, maybe_compile
from mtl_bench.engine.compose import build_callbacks, build_parts, build_selection, describe_parts, finalise_config
from mtl_bench.engine.diagnostics import GradientDiagnostics
from mtl_bench.engine.evaluate import evaluate, loss_ratio_sum
from mtl_bench.engine.front_evaluation import true_front_record
from mtl_bench.engine.memory import peak_memory, reset_peak_memory
from mtl_bench.engine.optimizer_step import build_step, optimizer_step, read_log
from mtl_bench.engine.profile import maybe_profile
from mtl_bench.engine.step import StepResult
from mtl_bench.engine.threads import choose_threads
from mtl_bench.loggers import Logger
from mtl_bench.records import RunRecord, Status

log = logging.getLogger("mtl_bench")

Metrics = dict[str, dict[str, float]]
__all__ = ["Recipe", "TrainResult", "loss_ratio_sum", "train"]


@dataclass
class TrainResult:
    step: int
    val: Metrics
    test: Metrics
    summary: dict[str, float]
    wall_time_s: float
    initial_test: Metrics = field(default_factory=dict)
    record: Optional[RunRecord] = None  # what metrics.json holds (rank 0 of a completed run)


class Recipe:
    """`cfg` is the composed config (model, tasks, balancer, optim, precision: `_target_` nodes; trainer,
    seed, tag). Rank 0 alone writes to `run_dir` under torchrun; the others train their slice of each batch."""

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        *,
        overrides: Optional[list[str]] = None,
        choices: Optional[dict[str, str]] = None,
        bar: bool = False,
        parallel_runs: int = 1,
        cores: Optional[int] = None,
    ) -> None:
        """parallel_runs, cores: how many runs the launcher starts at once and the cores it allots each
        (engine/threads.py: parallel_runs_of, cores_of), for trainer.num_threads=auto."""
        self.cfg, self.run_dir, self.bar = cfg, Path(run_dir), bar
        self.parallel_runs, self.cores = parallel_runs, cores
        self.overrides, self.choices = overrides or [], choices or {}
        self.state = RunState(self.run_dir, cfg, self.overrides)
        self.conf: TrainerConf = OmegaConf.to_object(cfg.trainer)  # type: ignore[assignment]  # value checks
        self.seed = int(cfg.seed)
        self.step = 0
        self.initial_test: Metrics = {}
        self.logger: Logger | None = None  # rank 0's loggers (logger=<option>), as one (engine/metric_logging.py)
        self.dist: ddp.DistInfo | None = None
        self.diagnose: GradientDiagnostics | None = None  # this step's collector (trainer.diagnostics)
        self.stopped_together = False  # every rank stopped after the same step (an agreed stop signal)
        self.front_record: dict[str, Any] | None = None  # metrics.json's `front` (trainer.front.rays)

    def setup(self) -> None:
        """Build everything; restore a checkpoint (trainer.resume); set up the callbacks."""
        conf, cfg = self.conf, self.cfg
        device = pick_device(conf.device)
        self.dist = ddp.init_distributed(device)
        self.device = device = ddp.rank_device(device, self.dist)
        reset_peak_memory(device)
        self.run_dir = self.state.run_dir = Path(ddp.broadcast_text(str(self.run_dir)))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resume = self.state.resume_setting(conf.resume)
        checkpoint = find_checkpoint(resume, self.run_dir)
        if resume == "auto" and checkpoint is None and self.dist.is_main:
            log.warning("trainer.resume=auto: no checkpoint in %s, so this run starts at step 0", self.run_dir)
        seed_everything(self.seed)
        parts = build_parts(cfg, conf, device, self.dist.world_size)
        self.taskset, self.model, self.balancer = parts.taskset, parts.model, parts.balancer
        self.every = parts.every
        self.optimizer, self.scheduler, self.precision = parts.optimizer, parts.scheduler, parts.precision
        self.total_steps = parts.total_steps
        numel, runs = sum(p.numel() for p in self.model.parameters()), self.parallel_runs
        threads, why = choose_threads(conf.num_threads, model_numel=numel, parallel_runs=runs, cores=self.cores)
        torch.set_num_threads(threads)
        self.selection = build_selection(cfg, parts, self.higher_is_better)
        self.callbacks = build_callbacks(cfg, conf, parts, self.selection)
        # Compiled after the balancer is built (it may hook the last shared layer); checkpoints and evaluation
        # use the eager model, whose parameters the compiled forward shares.
        compiled = maybe_compile(self.model, conf.compile)
        forward_model = ddp.wrap_ddp(compiled, device, self.dist, per_task=conf.step_mode == "per_task")
        self.runner, self.nonfinite = build_step(self, parts, forward_model)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.implementations = describe_parts(parts, {"trainer.compile": implementation_of(compiled)})
        if checkpoint is not None:
            self.state.restore(self, load_checkpoint(checkpoint, device), checkpoint)
        self.callbacks.setup(self)
        if conf.compile:  # the optimizer says its own path when it is built
            log.info("trainer.compile: %s", self.implementations["trainer.compile"])
        log.info(why)  # after the build: a config error stays the one line a failed run prints
        ranks = f" x {self.dist.world_size} ranks" if self.dist.world_size > 1 else ""
        where = f"{self.run_dir} | {self.total_steps} steps on {device}{ranks} ({torch.get_num_threads()} threads)"
        log.info(
            "run dir %s, %s, %s mode | tasks %s", where, self.precision.name, conf.step_mode, self.taskset.task_names
        )

    @property
    def metric_names(self) -> dict[str, list[str]]:
        return {task: list(names) for task, names in self.higher_is_better.items()}

    @property
    def higher_is_better(self) -> dict[str, dict[str, bool]]:
        """Each task's metrics (its loss first) and whether higher is better."""
        return {t.name: {"loss": False, **t.higher_is_better} for t in self.taskset.tasks}

    @property
    def is_main(self) -> bool:
        """Rank 0 (or no DDP): the rank that writes the run's files and speaks to the user."""
        return self.dist is None or self.dist.is_main

    def elapsed(self) -> float:
        """Wall time of the run so far, earlier sessions of a resumed run included."""
        return self.state.elapsed_before + time.perf_counter() - self.started

    def save(self, elapsed: float) -> None:
        self.state.save(self, elapsed)

    def evaluate(self, split: str) -> Metrics:
        """`split`'s metrics of the model as trained (the callbacks prepare it: a front model's centre)."""
        self.callbacks.on_eval_start(self, split)
        tasks, data, conf = self.taskset.tasks, getattr(self.taskset, split), self.conf
        return evaluate(self.model, tasks, data, self.device, conf.eval_batch_size, conf.num_workers)

    def train(self) -> TrainResult:
        total, conf, n, every = self.total_steps, self.conf, len(self.taskset.tasks), self.every
        if not self.initial_test:  # L_i(0) for the loss-ratio summary, measured before any update
            self.initial_test = self.evaluate("test")
        if conf.detect_anomalous_params and self.is_main:  # called once, on the first losses
            self.runner.on_first_losses = lambda losses: report_parameters_outside_graph(losses, self.model)
        self.started = time.perf_counter()
        start, per_epoch = self.step, self.runner.steps_per_epoch
        window_losses, window_steps, window_start = torch.zeros(n, device=self.device), 0, time.perf_counter()
        self.model.train()
        try:
            self.callbacks.on_fit_start(self)
            with maybe_profile(conf.profile and self.is_main, self.run_dir) as profiler:
                while self.step < total:
                    if self.step % per_epoch == 0 or self.step == start:  # the epoch about to be trained (LTB)
                        self.model.set_progress(self.step // per_epoch, -(-total // per_epoch))
                    logging_now = (self.step + 1) % every.log == 0 or self.step + 1 == total
                    result = self.optimizer_step(logging_now)
                    self.step += 1
                    # a skipped step adds nothing to the window
                    window_losses += torch.where(torch.isfinite(result.losses), result.losses, 0.0)
                    window_steps += 1
                    profiler.step()
                    if logging_now:
                        rate = window_steps / (time.perf_counter() - window_start)
                        scalars, losses = read_log(self, window_losses / window_steps, result.measurements, rate)
                        self.callbacks.on_log(self, scalars, losses, rate)
                        window_losses.zero_()
                        window_start, window_steps = time.perf_counter(), 0
                    # Right after the step (a stop signal is honoured here): a stop starts no evaluation and
                    # writes its checkpoint once.
                    self.callbacks.on_step_end(self, result, logging_now)
                    evaluating = self.step % every.eval == 0 and self.step < total
                    saving = bool(every.checkpoint) and self.step % every.checkpoint == 0 and self.step < total
                    if evaluating:
                        self._evaluate_and_select()
                    if saving:
                        self.nonfinite.check(self.step)
                        self.save(self.elapsed())
                    if evaluating or saving:
                        self.callbacks.on_checkpoint_or_eval_end(self, logging_now)
        finally:
            self.callbacks.on_loop_end(self)
        val, test = self._evaluate_and_select()
        assert test is not None  # the last evaluation always tests
        final = TrainResult(self.step, val, test, {}, 0.0, self.initial_test)
        self.callbacks.on_fit_end(self, final)  # the selected metrics, the front's, the summary logged
        final.summary = {"test_loss_ratio_sum": loss_ratio_sum(final.test, self.initial_test)}
        final.wall_time_s = self.elapsed()
        self.save(final.wall_time_s)
        return final

    def _evaluate_and_select(self) -> tuple[Metrics, Metrics | None]:
        """Evaluate val (and test where a callback or the end of the run needs it); the callbacks see both."""
        val = self.evaluate("val")
        self.callbacks.on_eval(self, "val", val)
        test = None
        if self.callbacks.wants_test(self.step) or self.step == self.total_steps:
            test = self.evaluate("test")
            self.callbacks.on_eval(self, "test", test)
        self.callbacks.on_eval_end(self, val, test)
        return val, test

    def optimizer_step(self, logging_now: bool) -> StepResult:
        """One optimizer step (engine/optimizer_step.py), after the callbacks' on_step_start."""
        self.callbacks.on_step_start(self, logging_now)  # a front model's preference, the diagnostics' collector
        return optimizer_step(self, logging_now)

    def cleanup(self, together: bool = False) -> None:
        """Close what setup opened; `together`: every rank got here from the same point (the run completed, or
        an agreed stop signal stopped it after the same step), so the ranks can meet before leaving their group."""
        if hasattr(self, "runner"):  # set up: its loader workers stop now, not at interpreter exit
            self.runner.close()
        if hasattr(self, "callbacks"):
            self.callbacks.teardown(self)
        if self.dist is not None:
            ddp.shutdown_distributed(self.dist, together)

    def metrics_record(self, result: TrainResult) -> RunRecord:
        """What metrics.json holds for a completed run."""
        return RunRecord(
            Status.COMPLETED,
            step=result.step,
            wall_time_s=round(result.wall_time_s, 3),
            overrides=self.overrides,
            choices=self.choices,
            seed=self.seed,
            val=result.val,
            test=result.test,
            summary=result.summary,
            initial_test=result.initial_test,
            higher_is_better=self.higher_is_better,
            model_selection=self.selection.record(),
            implementations=self.implementations,
            reference=self.taskset.reference,
            front=self.front_record,
            true_front=true_front_record(self.taskset, self.cfg).get("true_front"),
            peak_memory=peak_memory(self.device),
            threads=torch.get_num_threads(),
            device=self.device.type,
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
        )


def train(
    cfg: DictConfig,
    run_dir: Path,
    *,
    overrides: Optional[list[str]] = None,
    choices: Optional[dict[str, str]] = None,
    bar: bool = False,
    parallel_runs: int = 1,
    cores: Optional[int] = None,
    attempt_dir: Optional[Path] = None,
) -> TrainResult:
    """Finalise the config, set up, train and clean up one run with outputs in `run_dir`: what `mtl-bench train`
    runs, and usable without Hydra's app (tests, notebooks: `mtl_bench.compose_config` composes as the CLI does).

    `overrides`: the overrides the config was composed with (a length given there replaces the preset's). A config
    refused by `finalise_config` raises ConfigError before anything is built or written; after that, metrics.json
    (rank 0) records the results, or `"status": "failed"` with the error. A run directory that already holds a
    run's record (a resume in place) keeps it unless this attempt writes a checkpoint: a failure before that is
    recorded in `attempt_dir` (if given: train.py's `.hydra/attempts/<n>`, where this attempt's .hydra/ and log
    went), and once it writes one, `attempt_dir`'s record becomes the run's (RunState.promote)."""
    finalise_config(cfg, overrides or [])
    recipe = Recipe(
        cfg, run_dir, overrides=overrides, choices=choices, bar=bar, parallel_runs=parallel_runs, cores=cores
    )
    completed = False
    try:
        try:
            recipe.setup()
            result = recipe.train()
            completed = True
        except BaseException as err:
            if recipe.is_main:
                recipe.state.record_failure(err, recipe.step, recipe.choices, attempt_dir)
            raise
        finally:
            recipe.cleanup(completed or recipe.stopped_together)
        if recipe.dist is not None and recipe.dist.is_main:
            result.record = recipe.metrics_record(result)
            done = (result.step, result.wall_time_s, result.record.write(recipe.run_dir))
            log.info("done: %d steps in %.1f s; final metrics in %s", *done)
    finally:
        recipe.state.promote(attempt_dir)  # the checkpoint is this attempt's now: so is the record
    return result
