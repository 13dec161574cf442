"""Gradient clipping and the total gradient norm (mmcv OptimizerHook's grad_clip and its logged grad_norm)."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor, nn

from mtl_bench.config import GradClipConf


def total_grad_norm(grads: list[Tensor], norm_type: float) -> Tensor:
    """The norm of all gradients as one vector (0-d, float32, on the gradients' device; no host sync)."""
    if not grads:
        return torch.zeros(())
    per_tensor = torch._foreach_norm(grads, norm_type)  # one kernel per device/dtype, as clip_grad_norm_ does
    return torch.linalg.vector_norm(torch.stack([n.float() for n in per_tensor]), norm_type)


def clip_gradients(params: Iterable[nn.Parameter], conf: GradClipConf, measure: bool) -> Tensor | None:
    """Clip as configured; return the total norm measured before clipping when clipping by norm or `measure`."""
    grads = [p.grad for p in params if p.grad is not None]
    if conf.max_norm is not None:
        norm = total_grad_norm(grads, conf.norm_type)
        torch._foreach_mul_(grads, (conf.max_norm / (norm + 1e-6)).clamp(max=1.0).to(grads[0].device))
        return norm
    measured = total_grad_norm(grads, conf.norm_type) if measure else None
    if conf.clip_value is not None:
        torch._foreach_clamp_min_(grads, -conf.clip_value)
        torch._foreach_clamp_max_(grads, conf.clip_value)
    return measured
