"""One training run as one object: `setup()` builds the parts from config, `train()` runs the loop,
`cleanup()` closes what setup opened. `train(cfg, run_dir)` below does all three and writes metrics.json."""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from mtl_bench import tags
from mtl_bench.analysis.criterion import score
from mtl_bench.config import TrainerConf, keys_where, option_defaults
from mtl_bench.engine.anomalous import parameters_outside_graph
from mtl_bench.engine.builders import build, node_dict, pick_device
from mtl_bench.engine.checkpoint import (
    CHECKPOINT_NAME,
    find_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from mtl_bench.engine.compile import implementation_of, maybe_compile
from mtl_bench.engine.compose import build_parts, describe_parts, finalise_config
from mtl_bench.engine.diagnostics import GRAD_COS_MATRIX, GradientDiagnostics, heatmap
from mtl_bench.engine.distributed import (
    DistInfo,
    broadcast_text,
    init_distributed,
    rank_device,
    shutdown_distributed,
    wrap_ddp,
)
from mtl_bench.engine.evaluate import evaluate
from mtl_bench.engine.front import FrontRun, front_run, true_front_record
from mtl_bench.engine.gradients import clip_gradients
from mtl_bench.engine.memory import peak_memory, reset_peak_memory
from mtl_bench.engine.nonfinite import NonFinitePolicy, nonfinite_flag, step_unless
from mtl_bench.engine.preemption import StopSignals, resume_hint, signal_name
from mtl_bench.engine.profile import maybe_profile
from mtl_bench.engine.progress import Progress
from mtl_bench.engine.selection import ModelSelection, eval_steps
from mtl_bench.engine.step import StepResult, StepRunner
from mtl_bench.engine.threads import choose_threads
from mtl_bench.errors import Interrupted, ResumeError
from mtl_bench.loggers import Logger, Loggers, RunInfo
from mtl_bench.loggers.hparams import flatten_hparams, hparam_values
from mtl_bench.optim.cyclic import group_momentum
from mtl_bench.records import METRICS_FILE, RunRecord, Status, previous_status, record_failure

log = logging.getLogger("mtl_bench")

Metrics = dict[str, dict[str, float]]
# What may change when a run resumes (config.py: the options declared resumable); any other difference would
# train another config than the run records.
RESUMABLE_KEYS = keys_where("resumable")


@dataclass
class TrainResult:
    step: int
    val: Metrics
    test: Metrics
    summary: dict[str, float]
    wall_time_s: float
    initial_test: Metrics = field(default_factory=dict)
    record: Optional[RunRecord] = None  # what metrics.json holds (rank 0 of a completed run)


def loss_ratio_sum(test: Metrics, initial: Metrics) -> float:
    """The GradNorm paper's summary: sum_i L_i / L_i(0), test losses against those of the untrained model."""
    return sum(test[task]["loss"] / initial[task]["loss"] for task in test)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
        attempt_dir: Optional[Path] = None,
    ) -> None:
        """parallel_runs, cores: how many runs the launcher starts at once and the cores it allots each
        (engine/threads.py: parallel_runs_of, cores_of), for trainer.num_threads=auto. attempt_dir: where this
        attempt's own record goes when `run_dir` already holds a run's (train.py: `.hydra/attempts/<n>`)."""
        self.cfg, self.run_dir, self.bar = cfg, Path(run_dir), bar
        self.attempt_dir = attempt_dir
        # A run's record (metrics.json, the checkpoint) is kept as it is unless this attempt writes a checkpoint
        self.had_record = (self.run_dir / METRICS_FILE).is_file() or self.checkpoint_path.is_file()
        self.saved_here = False  # this attempt wrote checkpoints/last.pt
        self.parallel_runs, self.cores = parallel_runs, cores
        self.overrides, self.choices = overrides or [], choices or {}
        self.conf: TrainerConf = OmegaConf.to_object(cfg.trainer)  # type: ignore[assignment]  # value checks
        self.seed = int(cfg.seed)
        self.step = 0
        self.elapsed_before = 0.0  # wall time of earlier sessions of a resumed run
        self.initial_test: Metrics = {}
        self.logger: Logger | None = None  # rank 0's loggers (logger=<option>), as one
        self.dist: DistInfo | None = None
        self.signals = StopSignals(self._say, self._abort)
        self.stopped_together = False  # every rank stopped after the same step (an agreed stop signal)
        self.front_record: dict[str, Any] | None = None  # metrics.json's `front` (trainer.front.rays)
        self.saved_step: int | None = None  # the step of checkpoints/last.pt, once this run wrote or read one

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Build everything; on rank 0 open the run's loggers."""
        conf, cfg = self.conf, self.cfg
        device = pick_device(conf.device)
        self.dist = init_distributed(device)
        self.device = device = rank_device(device, self.dist)
        reset_peak_memory(device)
        self.run_dir = Path(broadcast_text(str(self.run_dir)))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resume = self._resume_setting()
        checkpoint = find_checkpoint(resume, self.run_dir)
        if resume == "auto" and checkpoint is None and self.dist.is_main:
            log.warning("trainer.resume=auto: no checkpoint in %s, so this run starts at step 0", self.run_dir)

        seed_everything(self.seed)
        parts = build_parts(cfg, conf, device, self.dist.world_size)
        self.taskset, self.model, self.balancer = parts.taskset, parts.model, parts.balancer
        self.every = parts.every
        self.optimizer, self.scheduler, self.precision = parts.optimizer, parts.scheduler, parts.precision
        self.total_steps = parts.total_steps
        self.front: FrontRun | None = front_run(self.model, self.balancer, cfg, conf, self.taskset.task_names)
        threads, why = choose_threads(
            conf.num_threads,
            model_numel=sum(p.numel() for p in self.model.parameters()),
            parallel_runs=self.parallel_runs,
            cores=self.cores,
        )
        torch.set_num_threads(threads)
        self.diagnostics = (
            GradientDiagnostics(list(self.model.shared_parameters()), self.taskset.task_names)
            if conf.diagnostics
            else None
        )
        self.selection: ModelSelection = build(
            "select",
            cfg.select,
            ModelSelection,
            higher_is_better=self.higher_is_better,
            reference=self.taskset.reference,
            eval_steps=eval_steps(self.total_steps, self.every.eval),
        )
        # Compiled after the balancer is built (it may hook the last shared layer); checkpoints and evaluation
        # use the eager model, whose parameters the compiled forward shares.
        compiled = maybe_compile(self.model, conf.compile)
        forward_model = wrap_ddp(compiled, device, self.dist, per_task=conf.step_mode == "per_task")
        self.runner = StepRunner(
            forward_model,
            self.taskset,
            self.balancer,
            self.precision,
            conf,
            self.seed,
            device,
            self.dist.rank,
            self.dist.world_size,
            optimizer=self.optimizer,
            validation=parts.validation,
        )
        self.nonfinite = NonFinitePolicy(
            self.taskset.task_names,
            conf.on_nonfinite,
            device,
            conf.max_skipped_fraction,
            conf.skipped_window,
            scaler_skips=self.precision.scaler is not None,
            total_steps=self.total_steps,
            weights_source=self.balancer.part_name,
        )
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.implementations = describe_parts(parts, {"trainer.compile": implementation_of(compiled)})
        if checkpoint is not None:
            self.restore(load_checkpoint(checkpoint, device), checkpoint)
        if self.dist.is_main:
            self.logger = self._build_loggers()
            if self.step == 0:
                self._write_hparams()
        if conf.compile:  # the optimizer says its own path when it is built
            log.info("trainer.compile: %s", self.implementations["trainer.compile"])
        log.info(why)  # after the build: a config error stays the one line a failed run prints
        ranks = f" x {self.dist.world_size} ranks" if self.dist.world_size > 1 else ""
        log.info(
            "run dir %s | %d steps on %s%s (%d threads), %s, %s mode | tasks %s",
            self.run_dir,
            self.total_steps,
            device,
            ranks,
            torch.get_num_threads(),
            self.precision.name,
            conf.step_mode,
            self.taskset.task_names,
        )

    def _resume_setting(self) -> str | None:
        """trainer.resume; a job that submitit requeued after preemption resumes its own run by itself."""
        if self.conf.resume is None and os.environ.get("SUBMITIT_EXECUTOR"):
            if previous_status(self.run_dir) is Status.INTERRUPTED:
                return "auto"
        return self.conf.resume

    def _build_loggers(self) -> Logger:
        """Each node under `logger:` (none: nothing is logged but the console), as one."""
        run = RunInfo(self.run_dir, self.step or None, self.metric_names, self.choices.get("tasks"))
        nodes = node_dict(self.cfg.logger) if self.cfg.get("logger") else {}
        loggers: list[Logger] = []
        try:
            for name, node in nodes.items():
                loggers.append(build(f"logger.{name}", node, run=run))  # a Logger, or a class with its methods
        except BaseException:
            Loggers(loggers).close()  # those already open
            raise
        return Loggers(loggers)

    def _write_hparams(self) -> None:
        assert self.logger is not None
        config = OmegaConf.to_container(self.cfg, resolve=True)
        values = hparam_values(config, self.choices)  # type: ignore[arg-type]
        final = [tags.metric("test", t, m) for t, names in self.metric_names.items() for m in names]
        self.logger.log_hparams(values, final + [tags.TEST_LOSS_RATIO_SUM])

    @property
    def metric_names(self) -> dict[str, list[str]]:
        return {task: list(names) for task, names in self.higher_is_better.items()}

    @property
    def higher_is_better(self) -> dict[str, dict[str, bool]]:
        """Each task's metrics (its loss first) and whether higher is better."""
        return {t.name: {"loss": False, **t.higher_is_better} for t in self.taskset.tasks}

    # ------------------------------------------------------------------ checkpoints

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / CHECKPOINT_NAME

    def save(self, elapsed: float) -> None:
        if self.dist is not None and not self.dist.is_main:
            return
        save_checkpoint(
            self.checkpoint_path,
            {
                "step": self.step,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "balancer": self.balancer.state_dict(),
                "grad_scaler": self.precision.scaler.state_dict() if self.precision.scaler is not None else None,
                **self.nonfinite.state_dict(),
                "rng": rng_state(),
                "initial_test": self.initial_test,
                "selection": self.selection.state_dict(),
                "elapsed_s": elapsed,
                "config": OmegaConf.to_yaml(self.cfg, resolve=True),  # what was trained (checked on resume)
                "overrides": self.overrides,
            },
        )
        self.saved_step = self.step
        self.saved_here = True

    def check_same_config(self, state: dict[str, Any], source: Path) -> None:
        """Resume is the same run or nothing: any difference outside RESUMABLE_KEYS stops with one line (the run's
        record is left as it was: train.py writes this attempt's config apart)."""
        if "config" not in state:
            return
        saved = flatten_hparams(OmegaConf.to_container(OmegaConf.create(state["config"])))  # type: ignore[arg-type]
        now = flatten_hparams(OmegaConf.to_container(self.cfg, resolve=True))  # type: ignore[arg-type]
        defaults = option_defaults()
        differ = [
            key
            for key in sorted(set(saved) | set(now))
            if saved.get(key, "(unset)") != now.get(key, "(unset)")
            and not any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)  # logger.* too
            # an option added since the checkpoint was written, at its default: what the earlier version did
            and not (
                key not in saved and key in defaults and now.get(key) == flatten_hparams({key: defaults[key]})[key]
            )
        ]
        if not differ:
            return
        changes = ", ".join(f"{k} {saved.get(k, '(unset)')} -> {now.get(k, '(unset)')}" for k in differ[:6])
        more = f" and {len(differ) - 6} more" if len(differ) > 6 else ""
        raise ResumeError(
            f"trainer.resume: {source} was trained with another config ({changes}{more}); only "
            f"{', '.join(k.split('.')[-1] for k in RESUMABLE_KEYS)} may change on resume. To train "
            "this config, start a new run (without trainer.resume, or in a new hydra.run.dir)"
        )

    def restore(self, state: dict[str, Any], source: Path) -> None:
        self.check_same_config(state, source)
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.balancer.load_state_dict(state["balancer"])
        except (RuntimeError, ValueError, KeyError) as err:
            first_line = str(err).strip().splitlines()[0]
            raise ResumeError(f"trainer.resume: checkpoint {source} does not fit this config ({first_line})") from None
        self.scheduler.load_state_dict(state["scheduler"])
        if self.precision.scaler is not None and state.get("grad_scaler"):
            self.precision.scaler.load_state_dict(state["grad_scaler"])
        self.nonfinite.load_state_dict(state)
        set_rng_state(state["rng"])
        self.step = state["step"]
        self.initial_test = state["initial_test"]
        self.selection.load_state_dict(state["selection"])
        self.elapsed_before = state["elapsed_s"]
        self.saved_step = self.step
        log.info("resumed from %s at step %d", source, self.step)

    # ------------------------------------------------------------------ the loop

    def evaluate(self, split: str) -> Metrics:
        if self.front is not None:  # a front model's ordinary metrics are at the simplex's centre
            self.front.centre()
        return self._evaluate(split)

    def _evaluate(self, split: str) -> Metrics:
        return evaluate(
            self.model,
            self.taskset.tasks,
            getattr(self.taskset, split),
            self.device,
            self.conf.eval_batch_size,
            self.conf.num_workers,
        )

    def train(self) -> TrainResult:
        total, conf, n = self.total_steps, self.conf, len(self.taskset.tasks)
        if not self.initial_test:  # L_i(0) for the loss-ratio summary, measured before any update
            self.initial_test = self.evaluate("test")
        if conf.detect_anomalous_params and self.is_main:  # called once, on the first losses
            self.runner.on_first_losses = self._report_parameters_outside_graph
        progress = Progress(total, self.step, self.bar)
        started = time.perf_counter()
        start = self.step
        window_losses, window_steps, window_start = torch.zeros(n, device=self.device), 0, time.perf_counter()
        self.model.train()
        try:
            with self.signals, maybe_profile(conf.profile and self.is_main, self.run_dir) as profiler:
                while self.step < total:
                    if self.step % self.runner.steps_per_epoch == 0 or self.step == start:
                        self._set_progress()
                    logging_now = (self.step + 1) % self.every.log == 0 or self.step + 1 == total
                    result = self.optimizer_step(logging_now)
                    self.step += 1
                    # a skipped step adds nothing to the window
                    window_losses += torch.where(torch.isfinite(result.losses), result.losses, 0.0)
                    window_steps += 1
                    profiler.step()
                    if logging_now:
                        rate = window_steps / (time.perf_counter() - window_start)
                        self._log_train(window_losses / window_steps, result.measurements, rate, progress)
                        window_losses.zero_()
                        window_start, window_steps = time.perf_counter(), 0
                    else:
                        progress.update(self.step)
                    # Right after the step: a stop starts no evaluation and writes its checkpoint once. After the
                    # last step too: the resumed run then only evaluates.
                    if self._stopping(logging_now):
                        self._stop(self.elapsed_before + time.perf_counter() - started)
                    evaluating = self.step % self.every.eval == 0 and self.step < total
                    saving = (
                        bool(self.every.checkpoint) and self.step % self.every.checkpoint == 0 and self.step < total
                    )
                    if evaluating:
                        self._evaluate_and_select()
                    if saving:
                        self.nonfinite.check(self.step)
                        self.save(self.elapsed_before + time.perf_counter() - started)
                    if (evaluating or saving) and self._stopping(logging_now):  # a signal during them
                        self._stop(self.elapsed_before + time.perf_counter() - started)
        finally:
            progress.close()
        val, test = self._evaluate_and_select()
        assert test is not None  # the last evaluation always tests
        val, test = self._selected(val, test)
        if self.front is not None and self.front.rays:  # the final model's front, on val and test
            fronts = {split: self.front.evaluate(lambda: self._evaluate(split)) for split in ("val", "test")}
            self.front.log(fronts["val"], self.logger, self.step)
            self.front_record = self.front.record(fronts)
        summary = {"test_loss_ratio_sum": loss_ratio_sum(test, self.initial_test)}
        if self.logger is not None:
            self.logger.log_scalars({tags.TEST_LOSS_RATIO_SUM: summary["test_loss_ratio_sum"]}, self.step)
        wall = self.elapsed_before + time.perf_counter() - started
        self.save(wall)
        return TrainResult(self.step, val, test, summary, wall, self.initial_test)

    def _set_progress(self) -> None:
        """The epoch about to be trained, for architectures that schedule by it (LTB); after a resume too."""
        per_epoch = self.runner.steps_per_epoch
        self.model.set_progress(self.step // per_epoch, -(-self.total_steps // per_epoch))

    def _evaluate_and_select(self) -> tuple[Metrics, Metrics | None]:
        """Evaluate val (and test where the selection or the end of the run needs it); the selection sees both."""
        val = self.evaluate("val")
        self._log_eval("val", val)
        if hasattr(self.scheduler, "validation_step"):  # a schedule stepped by a validation criterion (Plateau)
            self.scheduler.validation_step(
                score(
                    val,
                    self.scheduler.criterion,
                    self.higher_is_better,
                    self.taskset.reference,
                    "optim.schedule.criterion",
                )
            )
        if self.front is not None and self.front.rays and self.step < self.total_steps:
            self.front.log(self.front.evaluate(lambda: self._evaluate("val")), self.logger, self.step)
        test = None
        if self.selection.wants_test(self.step) or self.step == self.total_steps:
            test = self.evaluate("test")
            self._log_eval("test", test)
        self.selection.observe(self.step, val, test, self.model)
        return val, test

    def _selected(self, val: Metrics, test: Metrics) -> tuple[Metrics, Metrics]:
        """The val and test metrics the run reports (select=<option>); the final model stays in the checkpoint."""

        def evaluate_test(label: str) -> Metrics:
            metrics = self.evaluate("test")
            self._log_eval(label, metrics, log_only=True)
            return metrics

        return self.selection.selected(val, test, self.model, evaluate_test)

    def _stopping(self, logging_now: bool) -> bool:
        world_size = 1 if self.dist is None else self.dist.world_size
        return self.signals.agreed(world_size, self.device, logging_now)

    @property
    def is_main(self) -> bool:
        """Rank 0 (or no DDP): the rank that writes the run's files and speaks to the user."""
        return self.dist is None or self.dist.is_main

    def _say(self, message: str) -> None:
        if self.is_main:
            print(f"mtl-bench: {message}", file=sys.stderr, flush=True)

    def _abort(self, signum: int) -> None:
        """Leave now, from wherever the main thread is: a checkpoint being written is dropped (its temp file is
        removed; checkpoints/last.pt is only ever replaced by a complete file), the last one stays as it was."""
        if self.saved_step is None:
            kept = "no checkpoint was written"
        else:
            kept = (
                f"checkpoint {self.checkpoint_path} (step {self.saved_step}) is unchanged. {resume_hint(self.run_dir)}"
            )
        message = f"aborted by a second {signal_name(signum)} at step {self.step}; {kept}"
        self._say(message)
        raise Interrupted(signum, message)

    def _stop(self, elapsed: float) -> None:
        received = self.signals.received
        assert received is not None
        self.nonfinite.check(self.step)  # a checkpoint holds a good state only
        if self.saved_step != self.step:  # not just written by the periodic checkpoint
            self.save(elapsed)
        message = (
            f"stopped by {signal_name(received)} after step {self.step}; checkpoint {self.checkpoint_path} written. "
            f"{resume_hint(self.run_dir)}"
        )
        self._say(message)
        self.signals.hand_over()
        self.stopped_together = True
        raise Interrupted(received, message)

    def optimizer_step(self, logging_now: bool) -> StepResult:
        """Forwards and backwards of one step, clipping, then the optimizer step unless it is not finite.

        fp16 steps through its GradScaler, which skips steps with non-finite gradients; fp32 and bf16 check
        the gradients' norm (engine/nonfinite.py). A non-finite loss makes every gradient NaN (the step's
        backward factor), so both catch it. A skipped step leaves model, optimizer and balancer untouched
        and is decided on the device (no host sync in the loop with fused optimizers).
        """
        conf, scaler = self.conf, self.precision.scaler
        self.optimizer.zero_grad(set_to_none=True)
        diagnose = self.diagnostics is not None and logging_now and (self.step + 1) % conf.diagnostics_every == 0
        if self.front is not None:  # the model sees the preference the balancer weighs this step's losses by
            self.front.before_step()
        result = self.runner.run(self.step, self.diagnostics if diagnose else None, measure=logging_now)
        measured = result.measurements
        if logging_now:
            measured |= self.model.measurements()  # what an architecture learned (gates, cross-stitch units)
        clipping = conf.grad_clip.max_norm is not None or conf.grad_clip.clip_value is not None
        if scaler is not None and (clipping or logging_now):
            scaler.unscale_(self.optimizer)  # clip and measure the true gradients
        grad_norm = clip_gradients(self.trainable, conf.grad_clip, measure=logging_now)
        if grad_norm is not None:
            measured[tags.GRAD_NORM_TOTAL] = grad_norm
        if scaler is not None:
            measured[tags.LOSS_SCALE] = self.precision.loss_scale(result.losses)
            scaler.step(self.optimizer)
            found_inf = self.precision.found_inf(self.optimizer)
            self.precision.update()
        else:
            found_inf = nonfinite_flag([p.grad for p in self.trainable if p.grad is not None], grad_norm)
            step_unless(self.optimizer, found_inf)
        skipped = found_inf > 0
        measured |= self.balancer.step(skipped)  # commits the staged balancer state unless skipped
        self.scheduler.step()
        if hasattr(self.scheduler, "step_epoch") and (self.step + 1) % self.runner.steps_per_epoch == 0:
            self.scheduler.step_epoch()  # Eden decays with epochs as well as batches
        self.nonfinite.record(self.step, result.losses, skipped, self.balancer.nonfinite_weights)
        return result

    def _report_parameters_outside_graph(self, losses: Iterable[torch.Tensor]) -> None:
        unused = parameters_outside_graph(losses, self.model.named_parameters())
        if unused:
            log.warning("trainable parameters that do not reach the loss: %s", ", ".join(unused))
        else:
            log.info("detect_anomalous_params: every trainable parameter reaches the loss")

    def _log_train(
        self, mean_losses: torch.Tensor, measured: dict[str, torch.Tensor], rate: float, progress: Progress
    ) -> None:
        names, n = self.taskset.task_names, len(self.taskset.tasks)
        cos = measured.pop(GRAD_COS_MATRIX, None)
        if cos is not None and self.logger is not None:  # one image per diagnostic step
            self.logger.log_image(
                "grad_cos/heatmap", heatmap(cos.float().cpu().numpy(), self.taskset.task_names), self.step
            )
        # One host read per log interval: losses, the non-finite record and the balancer's measurements.
        values = torch.cat(
            [
                mean_losses.float(),
                self.nonfinite.device_values(),
                torch.stack(list(measured.values())).float().to(mean_losses.device)
                if measured
                else mean_losses.new_zeros(0),
            ]
        ).tolist()
        losses = dict(zip(names, values[:n]))
        scalars = {tags.loss(name): v for name, v in losses.items()}
        width = self.nonfinite.width
        scalars.update(zip(measured.keys(), values[n + width :]))
        skipped = self.nonfinite.check(self.step, values[n : n + width], scalars.get(tags.LOSS_SCALE))
        scalars[tags.STEPS_SKIPPED] = skipped
        for i, group in enumerate(self.optimizer.param_groups):
            name = group.get("name", i)
            scalars[tags.lr(name)] = group["lr"]
            momentum = group_momentum(group) if getattr(self.scheduler, "sets_momentum", False) else None
            if momentum is not None:  # only a schedule that moves it: a constant is no measurement
                scalars[tags.momentum(name)] = momentum
        scalars[tags.STEPS_PER_S] = rate
        if skipped > self.nonfinite.reported:
            log.warning("step %d: %d steps skipped so far (non-finite loss or gradients)", self.step, skipped)
            self.nonfinite.reported = skipped
        if self.logger is not None:
            self.logger.log_scalars(scalars, self.step)
        progress.update(self.step, losses, rate)

    def _log_eval(self, split: str, metrics: Metrics, log_only: bool = False) -> None:
        text = "; ".join(
            f"{task}: " + " ".join(f"{k} {v:.4g}" for k, v in values.items()) for task, values in metrics.items()
        )
        log.info("step %d %s | %s", self.step, split, text)
        if self.logger is not None and not log_only:
            scalars = {tags.metric(split, t, name): v for t, values in metrics.items() for name, v in values.items()}
            self.logger.log_scalars(scalars, self.step)
            self.logger.flush()

    # ------------------------------------------------------------------ cleanup

    def cleanup(self, together: bool = False) -> None:
        """Close what setup opened; `together`: every rank got here from the same point (the run completed, or
        an agreed stop signal stopped it after the same step), so the ranks can meet before leaving their group."""
        if hasattr(self, "runner"):  # set up: its loader workers stop now, not at interpreter exit
            self.runner.close()
        if self.logger is not None:
            self.logger.close()
            self.logger = None
        if self.dist is not None:
            shutdown_distributed(self.dist, together)

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
    recorded in `attempt_dir` (if given) instead."""
    finalise_config(cfg, overrides or [])
    recipe = Recipe(
        cfg,
        run_dir,
        overrides=overrides,
        choices=choices,
        bar=bar,
        parallel_runs=parallel_runs,
        cores=cores,
        attempt_dir=attempt_dir,
    )
    completed = False
    try:
        recipe.setup()
        result = recipe.train()
        completed = True
    except BaseException as err:
        if recipe.dist is None or recipe.dist.is_main:
            kept = recipe.had_record and not recipe.saved_here  # the run's record is the last good attempt's
            where = recipe.attempt_dir if kept or isinstance(err, ResumeError) else recipe.run_dir
            if where is not None:
                record_failure(where, err, recipe.step, recipe.overrides, recipe.choices)
        raise
    finally:
        recipe.cleanup(completed or recipe.stopped_together)
    if recipe.dist is not None and recipe.dist.is_main:
        result.record = recipe.metrics_record(result)
        result.record.write(recipe.run_dir)
        log.info(
            "done: %d steps in %.1f s; final metrics in %s",
            result.step,
            result.wall_time_s,
            recipe.run_dir / METRICS_FILE,
        )
    return result
