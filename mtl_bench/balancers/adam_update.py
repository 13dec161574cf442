"""Kingma & Ba, ICLR 2015, "Adam: A Method for Stochastic Optimization" (Algorithm 1, as torch.optim.Adam)."""

from __future__ import annotations

from torch import Tensor


def adam_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: Tensor,
    lr: float,
    betas: tuple[float, float],
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One step of `torch.optim.Adam` (no weight decay/amsgrad), out of place, on device tensors: the update
    of the small learned state of GradNorm, FAMO, IMTL-L and UW (their weights, logits, scales, log-variances).

    Out of place so the step can be committed or dropped with `torch.where` (a skipped step) without
    reading the skip flag on the host.
    """
    beta1, beta2 = betas
    step = step + 1
    exp_avg = exp_avg.lerp(grad, 1 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step).sqrt()
    denom = exp_avg_sq.sqrt() / bias_correction2_sqrt + eps
    return param - (lr / bias_correction1) * exp_avg / denom, exp_avg, exp_avg_sq, step
