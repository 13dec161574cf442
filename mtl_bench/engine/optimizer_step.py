"""The loop's optimizer step: the StepRunner's forwards and backwards, clipping, the optimizer step unless it is
not finite, the balancer's and the schedule's steps; and the one host read of each log interval."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from mtl_bench import tags
from mtl_bench.engine.compose import Parts
from mtl_bench.engine.gradients import clip_gradients
from mtl_bench.engine.nonfinite import NonFinitePolicy, nonfinite_flag, step_unless
from mtl_bench.engine.step import StepResult, StepRunner
from mtl_bench.optim.cyclic import group_momentum

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import Recipe

log = logging.getLogger("mtl_bench")


def build_step(run: Recipe, parts: Parts, forward_model: torch.nn.Module) -> tuple[StepRunner, NonFinitePolicy]:
    """The run's StepRunner (forwarding `forward_model`: compiled, DDP-wrapped) and its non-finite policy."""
    conf, dist = run.conf, run.dist
    assert dist is not None
    runner = StepRunner(
        forward_model,
        parts.taskset,
        parts.balancer,
        parts.precision,
        conf,
        run.seed,
        run.device,
        dist.rank,
        dist.world_size,
    )
    nonfinite = NonFinitePolicy(
        parts.taskset.task_names,
        conf.on_nonfinite,
        run.device,
        conf.max_skipped_fraction,
        conf.skipped_window,
        scaler_skips=parts.precision.scaler is not None,
        total_steps=parts.total_steps,
        weights_source=parts.balancer.part_name,
    )
    return runner, nonfinite


def optimizer_step(run: Recipe, logging_now: bool) -> StepResult:
    """Forwards and backwards of one step, clipping, then the optimizer step unless it is not finite.

    fp16 steps through its GradScaler, which skips steps with non-finite gradients; fp32 and bf16 check
    the gradients' norm (engine/nonfinite.py). A non-finite loss makes every gradient NaN (the step's
    backward factor), so both catch it. A skipped step leaves model, optimizer and balancer untouched
    and is decided on the device (no host sync in the loop with fused optimizers).
    """
    conf, scaler = run.conf, run.precision.scaler
    run.optimizer.zero_grad(set_to_none=True)
    result = run.runner.run(run.step, run.diagnose, measure=logging_now)
    measured = result.measurements
    if logging_now:
        measured |= run.model.measurements()  # what an architecture learned (gates, cross-stitch units)
    clipping = conf.grad_clip.max_norm is not None or conf.grad_clip.clip_value is not None
    if scaler is not None and (clipping or logging_now):
        scaler.unscale_(run.optimizer)  # clip and measure the true gradients
    grad_norm = clip_gradients(run.trainable, conf.grad_clip, measure=logging_now)
    if grad_norm is not None:
        measured[tags.GRAD_NORM_TOTAL] = grad_norm
    if scaler is not None:
        measured[tags.LOSS_SCALE] = run.precision.loss_scale(result.losses)
        scaler.step(run.optimizer)
        found_inf = run.precision.found_inf(run.optimizer)
        run.precision.update()
    else:
        found_inf = nonfinite_flag([p.grad for p in run.trainable if p.grad is not None], grad_norm)
        step_unless(run.optimizer, found_inf)
    skipped = found_inf > 0
    measured |= run.balancer.step(skipped)  # commits the staged balancer state unless skipped
    run.scheduler.step()
    if hasattr(run.scheduler, "step_epoch") and (run.step + 1) % run.runner.steps_per_epoch == 0:
        run.scheduler.step_epoch()  # Eden decays with epochs as well as batches
    run.nonfinite.record(run.step, result.losses, skipped, run.balancer.nonfinite_weights)
    return result


def read_log(
    run: Recipe, mean_losses: torch.Tensor, measured: dict[str, torch.Tensor], rate: float
) -> tuple[dict[str, float], dict[str, float]]:
    """One host read per log interval (losses, the non-finite record, the scalar measurements); the
    scalars and each task's mean loss for the callbacks' on_log (a measurement that is not 0-d, the diagnostics'
    cosine matrix, is left for them to read)."""
    names, n = run.taskset.task_names, len(run.taskset.tasks)
    measured = {k: v for k, v in measured.items() if v.dim() == 0}
    values = torch.cat(
        [
            mean_losses.float(),
            run.nonfinite.device_values(),
            torch.stack(list(measured.values())).float().to(mean_losses.device)
            if measured
            else mean_losses.new_zeros(0),
        ]
    ).tolist()
    losses = dict(zip(names, values[:n]))
    scalars = {tags.loss(name): v for name, v in losses.items()}
    width = run.nonfinite.width
    scalars.update(zip(measured.keys(), values[n + width :]))
    skipped = run.nonfinite.check(run.step, values[n : n + width], scalars.get(tags.LOSS_SCALE))
    scalars[tags.STEPS_SKIPPED] = skipped
    for i, group in enumerate(run.optimizer.param_groups):
        name = group.get("name", i)
        scalars[tags.lr(name)] = group["lr"]
        momentum = group_momentum(group) if getattr(run.scheduler, "sets_momentum", False) else None
        if momentum is not None:  # only a schedule that moves it: a constant is no measurement
            scalars[tags.momentum(name)] = momentum
    scalars[tags.STEPS_PER_S] = rate
    if skipped > run.nonfinite.reported:
        log.warning("step %d: %d steps skipped so far (non-finite loss or gradients)", run.step, skipped)
        run.nonfinite.reported = skipped
    return scalars, losses
