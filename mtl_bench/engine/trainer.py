"""The training loop: optimizer steps, periodic logging and evaluation, checkpoints, resume."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist
from torch import nn

from mtl_bench.balancers import Balancer
from mtl_bench.config import TrainerConf
from mtl_bench.engine.checkpoint import CHECKPOINT_NAME, rng_state, save_checkpoint, set_rng_state
from mtl_bench.engine.anomalous import parameters_outside_graph
from mtl_bench.engine.evaluate import evaluate
from mtl_bench.engine.gradients import clip_gradients
from mtl_bench.engine.precision import Precision
from mtl_bench.engine.profile import maybe_profile
from mtl_bench.engine.progress import Progress
from mtl_bench.engine.skip_step import nonfinite_flag, step_unless
from mtl_bench.engine.step import BackwardScale, StepRunner, optimizer_steps_per_epoch
from mtl_bench.errors import ConfigError, NonFiniteLossError
from mtl_bench.models import MultiTaskModel
from mtl_bench.optim.cyclic import group_momentum
from mtl_bench.run_logger import RunLogger
from mtl_bench.tasks import TaskSet

log = logging.getLogger("mtl_bench")

Metrics = dict[str, dict[str, float]]


@dataclass
class TrainResult:
    step: int
    val: Metrics
    test: Metrics
    summary: dict[str, float]
    wall_time_s: float
    initial_test: Metrics = field(default_factory=dict)


def metric_tags(split: str, metrics: Metrics) -> dict[str, float]:
    return {f"metric/{split}/{task}/{name}": v for task, values in metrics.items() for name, v in values.items()}


def loss_ratio_sum(test: Metrics, initial: Metrics) -> float:
    """The GradNorm paper's summary: sum_i L_i / L_i(0), test losses against those of the untrained model."""
    return sum(test[task]["loss"] / initial[task]["loss"] for task in test)


def count_steps(conf: TrainerConf, n_train: int, world_size: int = 1) -> int:
    """Optimizer steps of the whole run: trainer.epochs full passes, else trainer.max_steps."""
    return conf.epochs * optimizer_steps_per_epoch(conf, n_train, world_size) if conf.epochs else conf.max_steps


class Trainer:
    def __init__(
        self,
        *,
        taskset: TaskSet,
        model: MultiTaskModel,
        balancer: Balancer,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        conf: TrainerConf,
        seed: int,
        run_dir: Path,
        logger: RunLogger | None,
        bar: bool,
        precision: Precision,
        forward_model: Optional[nn.Module] = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        """`forward_model` is `model` wrapped for training (DistributedDataParallel); rank 0 alone writes files."""
        self.taskset, self.model, self.balancer = taskset, model, balancer
        self.optimizer, self.scheduler, self.conf = optimizer, scheduler, conf
        self.run_dir, self.logger, self.bar = run_dir, logger, bar
        self.precision, self.is_main = precision, rank == 0
        self.runner = StepRunner(forward_model or model, taskset, balancer, precision,
                                 BackwardScale(precision.scaler), conf, seed, rank, world_size)
        self.total_steps = count_steps(conf, len(taskset.train), world_size)
        self.step = 0
        self.elapsed_before = 0.0  # wall time of earlier sessions of a resumed run
        self.initial_test: Metrics = {}
        self.layout_written = False
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.skipped_steps = torch.zeros(())  # steps skipped for non-finite losses or gradients (on the device)
        self.skipped_reported = 0.0
        self.nonfinite_at = torch.full((len(taskset.tasks),), -1)  # first step with a non-finite loss, per task

    # ------------------------------------------------------------------ checkpoints

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / CHECKPOINT_NAME

    def save(self, elapsed: float) -> None:
        if not self.is_main:
            return
        save_checkpoint(self.checkpoint_path, {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "balancer": self.balancer.state_dict(),
            "grad_scaler": self.precision.scaler.state_dict() if self.precision.scaler is not None else None,
            "skipped_steps": self.skipped_steps.detach().clone(),
            "rng": rng_state(),
            "initial_test": self.initial_test,
            "elapsed_s": elapsed,
        })

    def restore(self, state: dict[str, Any], source: Path) -> None:
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.balancer.load_state_dict(state["balancer"])
        except (RuntimeError, ValueError, KeyError) as err:
            first_line = str(err).strip().splitlines()[0]
            raise ConfigError(f"trainer.resume: checkpoint {source} does not fit this config ({first_line})") from None
        self.scheduler.load_state_dict(state["scheduler"])
        if self.precision.scaler is not None and state.get("grad_scaler"):
            self.precision.scaler.load_state_dict(state["grad_scaler"])
        self.skipped_steps.fill_(state.get("skipped_steps", 0))
        set_rng_state(state["rng"])
        self.step = state["step"]
        self.initial_test = state["initial_test"]
        self.elapsed_before = state["elapsed_s"]
        log.info("resumed from %s at step %d", source, self.step)

    # ------------------------------------------------------------------ the loop

    def fit(self) -> TrainResult:
        tasks = self.taskset.tasks
        device = self.taskset.train.inputs.device
        total, conf = self.total_steps, self.conf
        if not self.initial_test:  # L_i(0) for the loss-ratio summary, measured before any update
            self.initial_test = evaluate(self.model, tasks, self.taskset.test)
        self.skipped_steps = self.skipped_steps.to(device)
        self.nonfinite_at = self.nonfinite_at.to(device)
        if conf.detect_anomalous_params and self.is_main:  # the runner calls it once, on the first losses
            self.runner.on_first_losses = self._report_parameters_outside_graph

        progress = Progress(total, self.step, self.bar)
        started = time.perf_counter()
        window_losses = torch.zeros(len(tasks), device=device)
        window_start, window_steps = time.perf_counter(), 0
        self.model.train()
        try:
            with maybe_profile(conf.profile and self.is_main, self.run_dir) as profiler:
                while self.step < total:
                    logging_now = (self.step + 1) % conf.log_every == 0 or self.step + 1 == total
                    measured = self._optimizer_step(logging_now)
                    self.step += 1
                    window_losses += measured.pop("_losses")
                    window_steps += 1
                    profiler.step()

                    if self.step % conf.log_every == 0 or self.step == total:
                        rate = window_steps / (time.perf_counter() - window_start)
                        self._log_train(window_losses / window_steps, measured, rate, progress)
                        window_losses.zero_()
                        window_start, window_steps = time.perf_counter(), 0
                    else:
                        progress.update(self.step)
                    if self.step % conf.eval_every == 0 and self.step < total:
                        self._log_eval("val", evaluate(self.model, tasks, self.taskset.val))
                    if conf.checkpoint_every and self.step % conf.checkpoint_every == 0 and self.step < total:
                        self._check_nonfinite()
                        self.save(self.elapsed_before + time.perf_counter() - started)
        finally:
            progress.close()

        val = evaluate(self.model, tasks, self.taskset.val)
        test = evaluate(self.model, tasks, self.taskset.test)
        summary = {"test_loss_ratio_sum": loss_ratio_sum(test, self.initial_test)}
        self._log_eval("val", val)
        self._log_eval("test", test, extra={f"summary/{k}": v for k, v in summary.items()})
        wall = self.elapsed_before + time.perf_counter() - started
        self.save(wall)
        return TrainResult(self.step, val, test, summary, wall, self.initial_test)

    def _optimizer_step(self, logging_now: bool) -> dict[str, torch.Tensor]:
        """Forwards and backwards of one step, clipping, then the optimizer step unless it is not finite.

        fp16 steps through its GradScaler, which skips steps with non-finite gradients; fp32 and bf16 check
        the gradients' norm (engine/skip_step.py). A non-finite loss makes every gradient NaN (see
        BackwardScale), so both catch it. A skipped step leaves model, optimizer and balancer untouched and
        is decided on the device (no host sync in the loop with fused optimizers).
        """
        conf, scaler = self.conf, self.precision.scaler
        self.optimizer.zero_grad(set_to_none=True)
        out = self.runner.run(self.step)
        measured = dict(out.metrics)
        clipping = conf.grad_clip.max_norm is not None or conf.grad_clip.clip_value is not None
        if scaler is not None and (clipping or logging_now):
            scaler.unscale_(self.optimizer)  # clip and measure the true gradients
        grad_norm = clip_gradients(self.trainable, conf.grad_clip, measure=logging_now)
        if grad_norm is not None:
            measured["grad_norm/total"] = grad_norm
        if scaler is not None:
            measured["amp/loss_scale"] = self.precision.loss_scale(out.losses)
            scaler.step(self.optimizer)
            found_inf = self.precision.found_inf(self.optimizer)
            self.precision.update()
        else:
            grads = [p.grad for p in self.trainable if p.grad is not None]
            found_inf = nonfinite_flag(grads, grad_norm)
            step_unless(self.optimizer, found_inf)
        skipped = found_inf > 0
        measured |= self.balancer.step(skipped)  # commits the staged balancer state unless skipped
        self._step_schedule()
        self.skipped_steps += skipped
        measured["steps/skipped"] = self.skipped_steps
        finite = torch.isfinite(out.losses)
        if conf.on_nonfinite == "raise":
            self.nonfinite_at = torch.where((self.nonfinite_at < 0) & ~finite, self.step, self.nonfinite_at)
        measured["_losses"] = torch.where(finite, out.losses, 0.0)  # a skipped step adds nothing to the window
        return measured

    def _agree_on_nonfinite(self) -> None:
        """Under DDP, every rank takes the earliest non-finite step of any rank, so all ranks stop together."""
        if self.conf.on_nonfinite != "raise" or not (dist.is_available() and dist.is_initialized()):
            return
        never = torch.iinfo(self.nonfinite_at.dtype).max
        at = torch.where(self.nonfinite_at < 0, never, self.nonfinite_at)
        dist.all_reduce(at, op=dist.ReduceOp.MIN)
        self.nonfinite_at = torch.where(at == never, -1, at)

    def _check_nonfinite(self, first_steps: Optional[list[float]] = None) -> None:
        """on_nonfinite=raise: stop, naming the first task and step with a non-finite loss.

        Checked where the loop reads the device anyway (log points) and before a checkpoint is written;
        the steps in between were skipped, so what was written holds the last good state.
        """
        if self.conf.on_nonfinite != "raise":
            return
        if first_steps is None:
            self._agree_on_nonfinite()
        steps = first_steps if first_steps is not None else self.nonfinite_at.tolist()
        bad = [(int(step), task.name) for step, task in zip(steps, self.taskset.tasks) if step >= 0]
        if bad:
            step, task = min(bad)
            raise NonFiniteLossError(f"non-finite loss for task {task!r} at step {step + 1} "
                                     "(trainer.on_nonfinite=raise; the step was skipped, checkpoints hold the "
                                     "last good state)")

    def _step_schedule(self) -> None:
        self.scheduler.step()
        if hasattr(self.scheduler, "step_epoch") and (self.step + 1) % self.runner.steps_per_epoch == 0:
            self.scheduler.step_epoch()  # Eden decays with epochs as well as batches

    def _report_parameters_outside_graph(self, losses: Iterable[torch.Tensor]) -> None:
        unused = parameters_outside_graph(losses, self.model.named_parameters())
        if unused:
            log.warning("trainable parameters that do not reach the loss: %s", ", ".join(unused))
        else:
            log.info("detect_anomalous_params: every trainable parameter reaches the loss")

    def _log_train(self, mean_losses: torch.Tensor, measured: dict[str, torch.Tensor], rate: float,
                   progress: Progress) -> None:
        names = [task.name for task in self.taskset.tasks]
        # One host sync per log interval: losses, the balancer's measurements and the non-finite record.
        device = mean_losses.device
        self._agree_on_nonfinite()
        values = torch.cat([mean_losses.float(), self.nonfinite_at.float(),
                            torch.stack(list(measured.values())).float().to(device)])
        numbers = values.tolist()
        n = len(names)
        self._check_nonfinite(numbers[n:2 * n])
        losses = dict(zip(names, numbers[:n]))
        scalars = {f"loss/{name}": v for name, v in losses.items()}
        scalars.update(zip(measured.keys(), numbers[2 * n:]))
        for i, group in enumerate(self.optimizer.param_groups):
            name = group.get("name", i)
            scalars[f"lr/{name}"] = group["lr"]
            momentum = group_momentum(group)
            if momentum is not None:
                scalars[f"momentum/{name}"] = momentum
        scalars["perf/steps_per_s"] = rate
        if scalars["steps/skipped"] > self.skipped_reported:
            log.warning("step %d: %d steps skipped so far (non-finite loss or gradients)", self.step,
                        scalars["steps/skipped"])
            self.skipped_reported = scalars["steps/skipped"]
        if self.logger is not None:
            if not self.layout_written:  # the tags are known only now (they depend on the balancer)
                metric_names = {t.name: ["loss", *t.higher_is_better] for t in self.taskset.tasks}
                self.logger.write_dashboard(metric_names, list(scalars))
                self.layout_written = True
            self.logger.scalars(scalars, self.step)
        progress.update(self.step, losses, rate)

    def _log_eval(self, split: str, metrics: Metrics, extra: dict[str, float] | None = None) -> None:
        text = "; ".join(f"{task}: " + " ".join(f"{k} {v:.4g}" for k, v in values.items())
                         for task, values in metrics.items())
        log.info("step %d %s | %s", self.step, split, text)
        if self.logger is not None:
            self.logger.scalars({**metric_tags(split, metrics), **(extra or {})}, self.step)
            self.logger.flush()
