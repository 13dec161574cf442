"""The non-finite policy in one place: skip a step whose gradients are not finite, deciding on the device,
count the skipped steps, and under `on_nonfinite=raise` stop at the next read of the device, naming the
first task and step with a non-finite loss (all DDP ranks agree on it first, so they stop together)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from mtl_bench.engine.gradients import total_grad_norm
from mtl_bench.errors import NonFiniteLossError


def nonfinite_flag(grads: list[Tensor], norm: Tensor | None = None) -> Tensor:
    """1.0 when any gradient holds a NaN or inf (their joint norm is then not finite), else 0.0; on the device.

    `norm`: the total gradient norm if the step already measured it (logging, clipping).
    """
    if norm is None:
        norm = total_grad_norm(grads, 2.0)
    return (~torch.isfinite(norm)).float()


def step_unless(optimizer: torch.optim.Optimizer, found_inf: Tensor) -> None:
    """optimizer.step() unless `found_inf` is nonzero.

    Fused torch optimizers (Adam, AdamW, SGD with fused=True) take the flag as GradScaler hands it to them
    (`found_inf`, `grad_scale` attributes) and skip inside the kernel: no host sync. Optimizers that skip
    non-finite steps themselves (`skips_nonfinite`, e.g. ScaledAdam) just step. Any other optimizer costs
    one host read of the flag per step.
    """
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf, optimizer.grad_scale = found_inf, None  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf, optimizer.grad_scale  # type: ignore[attr-defined]
    elif getattr(optimizer, "skips_nonfinite", False) or not found_inf.item():
        optimizer.step()


class NonFinitePolicy:
    """Per step `record(step, losses, skipped)` on the device; `check()` where the loop reads the device anyway
    (log points, before a checkpoint is written): the steps in between were skipped, so what was written
    holds the last good state."""

    def __init__(self, task_names: list[str], mode: str, device: torch.device) -> None:
        self.task_names, self.raises = task_names, mode == "raise"
        self.skipped = torch.zeros((), device=device)  # steps skipped for non-finite losses or gradients
        self.first_bad = torch.full((len(task_names),), -1, device=device)  # per task: first non-finite step
        self.reported = 0.0

    def record(self, step: int, losses: Tensor, skipped: Tensor) -> None:
        self.skipped += skipped
        if self.raises:
            bad = (self.first_bad < 0) & ~torch.isfinite(losses)
            self.first_bad = torch.where(bad, step, self.first_bad)

    def _agree(self) -> None:
        """Under DDP, every rank takes the earliest non-finite step of any rank."""
        if not self.raises or not (dist.is_available() and dist.is_initialized()):
            return
        never = torch.iinfo(self.first_bad.dtype).max
        at = torch.where(self.first_bad < 0, never, self.first_bad)
        dist.all_reduce(at, op=dist.ReduceOp.MIN)
        self.first_bad = torch.where(at == never, -1, at)

    def device_values(self) -> Tensor:
        """What `check` reads, to be fetched with the log point's one host read: [skipped, first_bad...]."""
        self._agree()
        return torch.cat([self.skipped.reshape(1).float(), self.first_bad.float()])

    def check(self, values: list[float] | None = None) -> float:
        """Raise under `raise` if a loss was not finite; return the skipped-step count. `values`: what
        `device_values()` gave, already on the host (else one read here)."""
        values = values if values is not None else self.device_values().tolist()
        bad = [(int(step), name) for step, name in zip(values[1:], self.task_names) if step >= 0]
        if self.raises and bad:
            step, task = min(bad)
            raise NonFiniteLossError(f"non-finite loss for task {task!r} at step {step + 1} "
                                     "(trainer.on_nonfinite=raise; the step was skipped, checkpoints hold the "
                                     "last good state)")
        return values[0]

    def state_dict(self) -> dict[str, Tensor]:
        return {"skipped_steps": self.skipped.detach().clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.skipped.fill_(state.get("skipped_steps", 0))
