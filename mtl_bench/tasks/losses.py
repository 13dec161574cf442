"""Per-task losses and metrics shared by the task sets (metrics are per-batch sums, see Task)."""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F


def _same_shape(pred: Tensor, target: Tensor) -> None:
    # (N, 1) against (N,) would silently broadcast to (N, N); shapes are host metadata, so no sync.
    if pred.shape != target.shape:
        raise ValueError(f"prediction shape {tuple(pred.shape)} != target shape {tuple(target.shape)}")


def mse_loss(pred: Tensor, target: Tensor) -> Tensor:
    """Mean over the batch and the output dimensions."""
    _same_shape(pred, target)
    return F.mse_loss(pred, target)


def mse_metrics(pred: Tensor, target: Tensor) -> dict[str, Tensor]:
    """Sum over the batch of each sample's mean squared error (over its output dimensions)."""
    _same_shape(pred, target)
    return {"mse": (pred.detach() - target).pow(2).reshape(pred.shape[0], -1).mean(dim=1).sum()}


def cross_entropy_loss(pred: Tensor, target: Tensor) -> Tensor:
    """`pred` holds logits (N, C); `target` int64 class indices (N,)."""
    return F.cross_entropy(pred, target)


def accuracy_metrics(pred: Tensor, target: Tensor) -> dict[str, Tensor]:
    """Count of correct arg-max predictions in the batch."""
    return {"accuracy": (pred.detach().argmax(dim=1) == target).sum().float()}
