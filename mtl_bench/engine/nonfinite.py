"""The non-finite policy in one place: skip a step whose gradients are not finite, deciding on the device,
and count the skipped steps. Under `on_nonfinite=raise` the run stops at the next read of the device,
naming the first step with a non-finite loss (and its task) or non-finite gradients; under `skip` it stops
as diverged when more than `max_skipped_fraction` of the last `skipped_window` steps were skipped. All
DDP ranks agree on the first bad step first, so they stop together."""

from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist
from torch import Tensor

from mtl_bench.engine.gradients import total_grad_norm
from mtl_bench.errors import ContractError, DivergedError, NonFiniteLossError


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

    def __init__(
        self,
        task_names: list[str],
        mode: str,
        device: torch.device,
        max_skipped_fraction: float | None = None,
        window: int = 100,
        scaler_skips: bool = False,
        total_steps: int | None = None,
        weights_source: str = "the balancer",
    ) -> None:
        """`scaler_skips`: fp16's grad scaler skips steps whose gradients overflow its scale, as part of
        finding the scale; `raise` then stops for non-finite losses only. `weights_source`: the part whose
        non-finite weights `record` is told of (`Balancer.part_name`), for the error line."""
        self.task_names, self.raises, self.scaler_skips = task_names, mode == "raise", scaler_skips
        self.max_fraction = max_skipped_fraction
        self.window = min(window, total_steps) if total_steps else window  # a shorter run is one window
        self.skipped = torch.zeros((), device=device)  # steps skipped for non-finite losses or gradients
        # first step with a non-finite loss, per task, then the first skipped step of any cause, then the first step
        # whose weights were not finite from finite inputs (the method's fault: it stops the run in any mode)
        self.first_bad = torch.full((len(task_names) + 2,), -1, device=device)
        self.weights_source = weights_source
        self.no_flag = torch.zeros(1, dtype=torch.bool, device=device)  # a step without the balancer's flag
        self.reported = 0.0
        self.history: deque[tuple[int, float]] = deque([(0, 0.0)])  # (step, skipped so far) at reads

    @property
    def width(self) -> int:
        """How many values `device_values` gives."""
        return 1 + len(self.first_bad)

    def record(self, step: int, losses: Tensor, skipped: Tensor, nonfinite_weights: Tensor | None = None) -> None:
        """On the device, no read: `nonfinite_weights` is the balancer's flag of this step (None: not set)."""
        self.skipped += skipped
        weights = self.no_flag if nonfinite_weights is None else nonfinite_weights.reshape(1).to(self.no_flag.device)
        flags = [~torch.isfinite(losses), skipped.reshape(1).to(torch.bool), weights]
        bad = torch.cat(flags) & (self.first_bad < 0)
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

    def first_bad_step(self, values: list[float]) -> tuple[int, str] | None:
        """(step counted from 1, what) of the first non-finite loss (naming its task), else of the first
        skipped step (non-finite gradients with finite losses); None when there was none."""
        bad = [(int(step), f"loss for task {name!r}") for step, name in zip(values[1:-2], self.task_names) if step >= 0]
        if bad:
            step, what = min(bad)
            return step + 1, what
        return (int(values[-2]) + 1, "gradients") if values[-2] >= 0 else None

    def check(self, step: int, values: list[float] | None = None, loss_scale: float | None = None) -> float:
        """Stop as the policy says; return the skipped-step count. `values`: what `device_values()` gave,
        already on the host (else one read here); `step`: steps done; `loss_scale`: fp16's current scale:
        while it is >= 1 the scaler is still finding its scale, and its skips are not divergence."""
        values = values if values is not None else self.device_values().tolist()
        if values[-1] >= 0:
            raise ContractError(
                f"{self.weights_source} returned non-finite weights at step {int(values[-1]) + 1} from a finite "
                "Gramian and losses (the step was skipped; checkpoints hold the last good state)"
            )
        first = self.first_bad_step(values)
        if self.raises and first is not None and not (self.scaler_skips and first[1] == "gradients"):
            raise NonFiniteLossError(
                f"non-finite {first[1]} at step {first[0]} (trainer.on_nonfinite=raise; the "
                "step was skipped, checkpoints hold the last good state)"
            )
        skipped = values[0]
        self.history.append((step, skipped))
        while len(self.history) > 1 and self.history[1][0] <= step - self.window:
            self.history.popleft()
        since, skipped_before = self.history[0]
        span = step - since
        finding_scale = self.scaler_skips and (loss_scale is None or loss_scale >= 1.0)
        if self.max_fraction is not None and span >= self.window and first is not None and not finding_scale:
            fraction = (skipped - skipped_before) / span
            if fraction > self.max_fraction:
                raise DivergedError(
                    f"diverged: {skipped - skipped_before:.0f} of the last {span} steps were skipped for non-finite "
                    f"losses or gradients ({skipped:.0f} in all; the first: non-finite {first[1]} at step {first[0]}); "
                    f"trainer.max_skipped_fraction={self.max_fraction} (checkpoints hold the last good state)"
                )
        return skipped

    def state_dict(self) -> dict[str, Tensor]:
        return {"skipped_steps": self.skipped.detach().clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.skipped.fill_(state.get("skipped_steps", 0))
