"""Dense-prediction losses (MTAN's `model_fit`, github.com/lorenmt/mtan im2im_pred/utils.py at c36c30b).

Which pixels count
- segmentation: labels outside [0, C) are ignored (the data mark them -1), in the loss and the metrics.
- depth, normals: a pixel is invalid where the target's channels sum to 0 (`torch.sum(x_output, dim=1) != 0`
  in every reference): depth 0, or an all-zero normal.

Losses (means over the batch's valid pixels, as `model_fit`/`calc_loss`)
- segmentation: cross-entropy of the logits, ignore_index=-1 (the references apply nll_loss to the model's
  log_softmax: the same number).
- depth: L1 over valid pixels. normal: 1 - cosine over valid pixels, the prediction first scaled to unit
  length (the references' SegNet does it in the head, LibMTL in the loss; either way the same).
  A batch without a valid pixel has loss 0 here (the references divide by zero).

"""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F

IGNORE_INDEX = -1


def check_shapes(pred: Tensor, target: Tensor, segmentation: bool = False) -> None:
    expected = (pred.shape[0], *pred.shape[2:]) if segmentation else pred.shape
    if pred.dim() != 4 or tuple(target.shape) != tuple(expected):
        want = "(N, C, H, W) logits and (N, H, W) labels" if segmentation else "(N, C, H, W) both"
        raise ValueError(
            f"prediction shape {tuple(pred.shape)} and target shape {tuple(target.shape)}: expected {want}"
        )


def valid_pixels(target: Tensor) -> Tensor:
    """(N, 1, H, W) bool: the target's channels do not sum to 0 (the references' `binary_mask`)."""
    return target.sum(dim=1, keepdim=True) != 0


def segmentation_loss(pred: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy of (N, C, H, W) logits against (N, H, W) int64 labels, -1 ignored."""
    check_shapes(pred, target, segmentation=True)
    return F.cross_entropy(pred, target, ignore_index=IGNORE_INDEX)


def depth_loss(pred: Tensor, target: Tensor) -> Tensor:
    """Mean |pred - target| over valid pixels."""
    check_shapes(pred, target)
    mask = valid_pixels(target)
    return ((pred - target).abs() * mask).sum() / mask.sum().clamp_min(1)


def normal_loss(pred: Tensor, target: Tensor) -> Tensor:
    """1 - mean cosine over valid pixels, of the unit-length prediction and the target."""
    check_shapes(pred, target)
    mask = valid_pixels(target)
    return 1 - (F.normalize(pred, dim=1) * target * mask).sum() / mask.sum().clamp_min(1)
