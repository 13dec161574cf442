"""Mixed precision: autocast per precision option, and for fp16 a grad scaler (mmcv Fp16OptimizerHook's loss_scale)."""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Mapping, Optional, Union

import torch
from torch import Tensor

from mtl_bench.gradient_engine.staged import current_scale

DTYPES = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}
NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
GRAD_SCALER_KEYS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


class Precision:
    """What the step needs: an autocast context and, for float16, a GradScaler (mmcv Fp16OptimizerHook's
    loss_scale forms). float32 and bfloat16 need no scaler: the loop checks their gradients itself
    (engine/nonfinite.py).

    A static `loss_scale` is a GradScaler whose scale is reset to that value at every update, so it
    still skips steps with non-finite gradients but never changes the scale.
    """

    def __init__(
        self,
        device: torch.device,
        dtype: str = "float32",
        loss_scale: Union[str, float, Mapping[str, float]] = "dynamic",
    ) -> None:
        """
        device: where the model runs (given by the engine).
        dtype: the autocast dtype: float32 (no autocast), bfloat16 or float16 (with a grad scaler).
        loss_scale: float16 only: dynamic, a number > 0 (a static scale) or a mapping of GradScaler's
            init_scale, growth_factor, backoff_factor, growth_interval.
        """
        if dtype not in DTYPES:
            raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
        self.name, self.device_type, self.dtype = NAMES[dtype], torch.device(device).type, DTYPES[dtype]
        self.scaler: Optional[torch.amp.GradScaler] = None
        self.static_scale: Optional[float] = None
        if dtype == "float16":
            self.scaler, self.static_scale = _grad_scaler(self.device_type, loss_scale)

    def autocast(self) -> ContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _grad_scaler(device_type: str, loss_scale: Any) -> tuple[torch.amp.GradScaler, Optional[float]]:
    """(scaler, static scale or None) from the loss_scale forms."""
    if isinstance(loss_scale, Mapping):
        for key, number in loss_scale.items():
            if key not in GRAD_SCALER_KEYS:
                raise ValueError(f"loss_scale.{key}: no such key; allowed: {', '.join(GRAD_SCALER_KEYS)}")
            if not (_is_number(number) and number > 0):
                raise ValueError(f"loss_scale.{key}: must be a number > 0, got {number!r}")
        args: dict[str, Any] = {k: (int(v) if k == "growth_interval" else float(v)) for k, v in loss_scale.items()}
        return torch.amp.GradScaler(device_type, **args), None
    if loss_scale == "dynamic":
        return torch.amp.GradScaler(device_type), None
    if not (_is_number(loss_scale) and loss_scale > 0):
        raise ValueError(
            f"loss_scale: must be dynamic, a number > 0 (a static scale) or a mapping of "
            f"{', '.join(GRAD_SCALER_KEYS)}, got {loss_scale!r}"
        )
    static = float(loss_scale)  # an int is a valid scale too (the seed raised on it)
    return torch.amp.GradScaler(device_type, init_scale=static), static
