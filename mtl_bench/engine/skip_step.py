"""Skip an optimizer step with non-finite gradients, deciding on the device where the optimizer allows it."""

from __future__ import annotations

import torch
from torch import Tensor

from mtl_bench.engine.gradients import total_grad_norm


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
