"""Mixed precision: autocast per precision option, and for fp16 a grad scaler (mmcv Fp16OptimizerHook's loss_scale)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager, Optional

import torch
from torch import Tensor

from mtl_bench.balancers.staged import current_scale

AUTOCAST_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Precision:
    """What the step needs: an autocast context and, for fp16, a GradScaler.

    A static `loss_scale` is a GradScaler whose scale is reset to that value at every update, so it
    still skips steps with non-finite gradients but never changes the scale.
    """

    name: str
    device_type: str
    scaler: Optional[torch.amp.GradScaler] = None
    static_scale: Optional[float] = None

    def autocast(self) -> ContextManager[Any]:
        dtype = AUTOCAST_DTYPES[self.name]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=dtype)

    def update(self) -> None:
        """After scaler.step(optimizer): adjust the scale (dynamic) or hold it (static)."""
        if self.scaler is not None:
            self.scaler.update(self.static_scale)

    def loss_scale(self, like: Tensor) -> Tensor:
        """The current scale as a 0-d tensor, without a host sync (`get_scale()` would call `.item()`)."""
        assert self.scaler is not None
        return current_scale(self.scaler, like)

    def found_inf(self, optimizer: torch.optim.Optimizer) -> Tensor:
        """After scaler.step, before update: 1.0 where the step was skipped for non-finite gradients (on device)."""
        # GradScaler records this per optimizer and clears it in update(); no public accessor exists.
        assert self.scaler is not None
        return sum(self.scaler._found_inf_per_device(optimizer).values())


def build_precision(conf: Any, device: torch.device) -> Precision:
    """`conf` is precision's PrecisionConf or Fp16PrecisionConf.

    fp32 and bf16 need no scaler: the trainer checks their gradients itself (engine/skip_step.py).
    """
    if conf.name != "fp16":
        return Precision(conf.name, device.type)
    loss_scale = conf.loss_scale
    if isinstance(loss_scale, dict):
        scaler = torch.amp.GradScaler(device.type, **{k: (int(v) if k == "growth_interval" else float(v))
                                                       for k, v in loss_scale.items()})
        return Precision("fp16", device.type, scaler)
    if loss_scale == "dynamic":
        return Precision("fp16", device.type, torch.amp.GradScaler(device.type))
    static = float(loss_scale)  # an int is a valid scale too (the seed raised on it)
    return Precision("fp16", device.type, torch.amp.GradScaler(device.type, init_scale=static), static)
