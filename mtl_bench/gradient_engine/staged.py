"""Staged state updates: what a balancer learns in `backward` takes effect in `step()` (see `Balancer`)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from mtl_bench.devices import cpu_value
from mtl_bench.gradient_engine.balancer import BackwardContext, Balancer, Context, task_list

JOINT, PER_TASK = "joint", "per_task"


def staging_buffer(module: nn.Module, name: str, like: Tensor) -> Tensor:
    """A tensor shaped and laid out like `like`, kept from step to step, to build `module`'s buffer `name`'s next value
    in (a fresh tensor of T values per parameter costs the first touch of every page on each step). Staged, a CPU
    spare becomes the buffer by trading places with it at the commit (the old buffer is the next spare)."""
    spares = module.__dict__.setdefault("_spares", {})  # not state: kept out of the module's registry
    spare = spares.get(name)
    if spare is None or spare.shape != like.shape or spare.stride() != like.stride() or spare.device != like.device:
        spare = spares[name] = torch.empty_like(like)
    return spare


def scaled_grad(
    loss: Tensor, inputs: Sequence[Tensor], scale: Tensor | None, retain_graph: bool = False, allow_unused: bool = False
) -> tuple[Tensor | None, ...]:
    """`torch.autograd.grad` of `scale * loss` (of `loss` when `scale` is None), like the real backward.

    The scale enters as the loss's gradient instead of as a product with the loss: the same bits, without a
    multiplication and its backward node per call (T of each per step). A loss of another dtype or shape than the
    scale keeps the product (an fp16 loss cannot hold a loss scale of 2^16)."""
    grad_output = None
    if scale is not None and loss.dtype == scale.dtype and loss.shape == scale.shape:
        grad_output = scale
    elif scale is not None:
        loss = loss * scale
    return torch.autograd.grad(
        loss, list(inputs), grad_outputs=grad_output, retain_graph=retain_graph, allow_unused=allow_unused
    )


def current_scale(scaler: BackwardContext | torch.amp.GradScaler, like: Tensor) -> Tensor:
    """The scale a backward is multiplied by, as a 0-d float32 tensor on `like`'s device, without a host sync.

    `GradScaler.get_scale()` calls `.item()`; `scale(1)` is public and stays on the device (a disabled
    scaler returns the 1 unchanged).
    """
    return scaler.scale(torch.ones((), dtype=torch.float32, device=like.device))


class StagedBalancer(Balancer):
    """A balancer with running state (buffers) whose updates wait for the optimizer step.

    Subclasses stage new buffer values with `_stage`, mark statistics with `_require_finite`, and in
    per-task mode implement `_finish()` (build the update from the collected per-task statistics).

    Tasks are kept in sorted name order, so buffers and sums over tasks do not depend on the order the
    tasks were listed in: ranks built from differently ordered configs hold bit-identical state, and a
    checkpoint loads whatever the order.
    """

    def __init__(self, task_names: Sequence[str]) -> None:
        task_names = task_list(type(self), task_names)
        if len(set(task_names)) != len(task_names):
            raise ValueError(f"task names repeat: {list(task_names)}")
        super().__init__(sorted(task_names))
        self._index = {name: i for i, name in enumerate(self.task_names)}
        self._reset()

    def _reset(self) -> None:
        self._mode: str | None = None
        self._sums: dict[str, tuple[Tensor, int]] = {}
        self._pending: dict[str, Tensor] = {}
        self._finite: Tensor | None = None
        self._ctx: BackwardContext | None = None
        self._scale: Tensor | None = None  # what this micro-batch's backward is multiplied by
        self._loss_scale: Tensor | None = None  # the grad scaler's scale at the step's start
        self._collected: dict[str, dict[str, Tensor]] = {}

    # ------------------------------------------------------------------ used by subclasses

    @property
    def accumulates(self) -> bool:
        return self._ctx is not None and self._ctx.accumulation_steps > 1

    @property
    def measuring(self) -> bool:
        """Whether this step's measurements will be read (`BackwardContext.measure`; always without a context)."""
        return self._ctx is None or self._ctx.measure

    def _begin(self, mode: str, ctx: Context, like: Tensor) -> Tensor | None:
        """Open (or continue, per task) a step; returns the backward's scale, or None without a context."""
        ctx = BackwardContext.of(ctx)
        repeat_ok = ctx is not None and ctx.accumulation_steps > 1 and mode == self._mode
        if self._mode is not None and (mode == JOINT or self._mode == JOINT) and not repeat_ok:
            raise RuntimeError(
                f"{type(self).__name__}: the previous step's update is still pending; call balancer.step() "
                "after each optimizer step (after scaler.update() when there is a grad scaler)"
            )
        if self._mode is None:
            self._mode = mode
            if ctx is not None and ctx.scaler is not None:
                self._loss_scale = current_scale(ctx.scaler, like)
        self._ctx = ctx
        # Each micro-batch's own scale: its factor may differ (NaN for a non-finite one).
        self._scale = current_scale(ctx, like) if ctx is not None else None
        return self._scale

    def _end_joint(self) -> None:
        """Joint backward done: without a context (a plain loop) commit now; with one, `step()` commits."""
        if self._ctx is None:
            self._commit(False)

    def _mean(self, key: str, value: Tensor) -> Tensor:
        """The mean of the values given for `key` in this step (one per micro-batch under accumulation)."""
        total, count = self._sums.get(key, (torch.zeros_like(value), 0))
        total, count = total + value, count + 1
        self._sums[key] = (total, count)
        return total / count

    def _stage(self, **values: Tensor) -> None:
        self._pending.update(values)

    def _staging_buffer(self, name: str, like: Tensor) -> Tensor:
        """`staging_buffer` of buffer `name` (a submodule's for "aggregator.tracked_0")."""
        return staging_buffer(*self._owner(name), like)

    def _owner(self, name: str) -> tuple[nn.Module, str]:
        """The module that holds buffer `name` (a submodule's for "weighting.lambdas") and the buffer's own name."""
        path, _, key = name.rpartition(".")
        return (self.get_submodule(path) if path else self), key

    def _current(self, name: str) -> Tensor:
        """The staged value of a buffer if this step already changed it, else the committed one."""
        owner, key = self._owner(name)
        committed = owner._buffers[key]
        assert committed is not None
        return self._pending.get(name, committed)

    def _require_finite(self, *stats: Tensor) -> None:
        ok = torch.stack([torch.isfinite(s).all() for s in stats]).all()
        self._finite = ok if self._finite is None else self._finite & ok

    def _grad(
        self, loss: Tensor, inputs: Sequence[Tensor], scale: Tensor | None, allow_unused: bool = False
    ) -> tuple[Tensor | None, ...]:
        """Gradient of one loss, scaled like the real backward (fp16 heads underflow otherwise)."""
        return scaled_grad(loss, inputs, scale, retain_graph=True, allow_unused=allow_unused)

    def _collect(self, task: str, **stats: Tensor) -> None:
        """Record a task's statistics for `_finish`; under accumulation, their mean over the micro-batches."""
        if task not in self._index:
            raise KeyError(f"task {task!r} is not one of the balancer's tasks {self.task_names}")
        if task in self._collected and not self.accumulates:
            raise RuntimeError(
                f"task {task!r} already had its backward in this step; call balancer.step() once per optimizer step"
            )
        self._collected[task] = {name: self._mean(f"{task}/{name}", value) for name, value in stats.items()}

    def _finish(self) -> dict[str, Tensor]:
        """Per-task mode: stage the update from `self._collected` (all tasks); return step metrics."""
        return {}

    def _commit(self, skipped: bool | Tensor) -> None:
        if skipped is not True:
            keep = self._finite
            if isinstance(skipped, Tensor):
                taken = ~skipped.to(torch.bool)
                keep = taken if keep is None else keep & taken.to(keep.device)
            for name, value in self._pending.items():
                owner, key = self._owner(name)
                buf = owner._buffers[key]
                assert buf is not None
                spares = owner.__dict__.get("_spares", {})
                if value is spares.get(key) and value.device.type == "cpu" and buf.stride() == value.stride():
                    # a CPU spare trades places with the buffer: no pass over its values (and reading the flags
                    # is no device sync on the CPU)
                    if keep is None or cpu_value(keep):
                        spares[key], owner._buffers[key] = buf, value
                elif keep is None:
                    buf.copy_(value)
                else:  # written in place: a fresh buffer of a T×P state costs its page faults on every step
                    torch.where(keep.to(buf.device), value.to(buf.dtype), buf, out=buf)
        self._reset()

    # ------------------------------------------------------------------ the public step

    def step(self, skipped: bool | Tensor | None = None) -> dict[str, Tensor]:
        """Commit this step's update; `skipped=None` asks the grad scaler (if any) whether it skipped."""
        if self._mode is None:
            return {}  # nothing pending: joint backward without a scaler already committed
        metrics: dict[str, Tensor] = {}
        if self._mode == PER_TASK:
            missing = [name for name in self.task_names if name not in self._collected]
            if missing:
                self._reset()
                raise RuntimeError(f"per-task step without a backward for tasks {missing}; update dropped")
            metrics = self._finish()
        if skipped is None:
            skipped = False
            scaler = self._ctx.scaler if self._ctx is not None else None
            if scaler is not None and self._loss_scale is not None:
                # update() multiplies the scale by backoff_factor < 1 exactly when it skipped the step.
                skipped = current_scale(scaler, self._loss_scale) < self._loss_scale
        self._commit(skipped)
        return metrics
