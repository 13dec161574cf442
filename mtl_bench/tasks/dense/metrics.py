"""Dense-prediction metrics (MTAN's `ConfMatrix` and `depth_error`/`normal_error`, github.com/lorenmt/mtan
im2im_pred/utils.py at c36c30b; LibMTL's averaging as the `error_batch=None` option).

Metrics (`metrics` returns sums on the device, added up over the split; `summarize` turns them into values)
- segmentation: the confusion matrix over the split (rows target, columns arg-max prediction, as `ConfMatrix`);
  `miou` = mean over classes of TP / (TP + FP + FN), `pixel_acc` = trace / total, both fractions (0..1, the
  scale of the references' numbers: Nash-MTL's BASE 0.3830). The references take `torch.mean` over all C
  classes, NaN when a class is neither in the targets nor predicted anywhere in the split; here such classes
  are left out of the mean (the same number whenever the reference's is finite).
- depth `abs_err`, `rel_err` (|p - t| / t); normal `angle_mean`, `angle_median` (degrees of
  acos(clamp(cos, -1, 1)) of the unit prediction and the target), `within_11_25`, `within_22_5`,
  `within_30` (fraction of valid pixels with angle strictly below, 0..1).
  How they are averaged over the split is `error_batch`:
  * an integer k (the default, k = the references' test batch size: 2 for NYUv2, 8 for Cityscapes): each
    consecutive group of k images (the references' test batches, `shuffle=False`) gets its own value over
    its valid pixels, and the split's value is the mean over groups: MTAN's, CAGrad's and Nash-MTL's test
    loop (`avg_cost += cost / test_batch`), which is where the Nash-MTL and CAGrad tables (and their
    single-task rows) come from. The median of each group is exact (numpy's: the mean of the two middle
    values for an even count). The groups follow the evaluation batches, so this needs evaluation batches
    that are multiples of k (all but the last), as mtl-bench's are.
  * None: over every valid pixel of the split (LibMTL: depth errors weighted by valid pixels, normal angles
    concatenated). The median is then read from a histogram of 0.01-degree bins accumulated on the device,
    interpolated within its bin: off by less than 0.01 degrees from the exact median.
  The engine adds the sums up in float32: counts above 2**24 round with a relative error below 1e-7.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor
from torch.nn import functional as F

from mtl_bench.tasks.dense.losses import check_shapes, valid_pixels

ANGLE_THRESHOLDS = {"within_11_25": 11.25, "within_22_5": 22.5, "within_30": 30.0}
HIST_BIN_DEGREES = 0.01
HIST_BINS = 18000  # 0..180 degrees


@torch.no_grad()
def segmentation_metrics(pred: Tensor, target: Tensor, num_classes: int) -> dict[str, Tensor]:
    """{"confusion": (C, C) counts}: rows the target class, columns the arg-max prediction."""
    check_shapes(pred, target, segmentation=True)
    c = num_classes
    keep = (target >= 0) & (target < c)
    # Ignored pixels go to an extra bin that is dropped; scatter_add (not bincount) needs no host sync on CUDA.
    index = torch.where(keep, target * c + pred.argmax(dim=1), c * c).flatten()
    counts = torch.zeros(c * c + 1, dtype=torch.int64, device=pred.device)
    counts.scatter_add_(0, index, torch.ones_like(index))
    return {"confusion": counts[: c * c].reshape(c, c)}


def segmentation_summary(sums: dict[str, Tensor], n: int) -> dict[str, Tensor]:
    h = sums["confusion"].double()
    hit = h.diagonal()
    union = h.sum(0) + h.sum(1) - hit
    present = union > 0
    iou = torch.where(present, hit / union.clamp_min(1), 0.0)
    return {"miou": (iou.sum() / present.sum()).float(), "pixel_acc": (hit.sum() / h.sum()).float()}


def _groups(n: int, group: Optional[int], device: torch.device) -> tuple[Tensor, int]:
    """Group id of each of n samples (consecutive groups of `group`; one group when None) and the count."""
    if group is None:
        return torch.zeros(n, dtype=torch.long, device=device), 1
    return torch.arange(n, device=device) // group, (n + group - 1) // group


def _per_group(values: Tensor, ids: Tensor, count: int) -> Tensor:
    """Sums of per-sample `values` (N,) within each group."""
    return torch.zeros(count, dtype=values.dtype, device=values.device).index_add_(0, ids, values)


@torch.no_grad()
def depth_metrics(pred: Tensor, target: Tensor, error_batch: Optional[int]) -> dict[str, Tensor]:
    """Per-pixel sums and the valid count (error_batch None), or sums of per-group means and the group count."""
    check_shapes(pred, target)
    pred, target = pred.float(), target.float()
    mask = valid_pixels(target).expand_as(target)
    error = (pred - target).abs()
    abs_sum = torch.where(mask, error, 0.0).flatten(1).sum(1)
    rel_sum = torch.where(mask, error / torch.where(mask, target, 1.0), 0.0).flatten(1).sum(1)
    valid = mask.flatten(1).sum(1).double()
    if error_batch is None:
        return {"abs_err": abs_sum.sum(), "rel_err": rel_sum.sum(), "count": valid.sum()}
    ids, count = _groups(len(pred), error_batch, pred.device)
    valid = _per_group(valid, ids, count)
    has = valid > 0  # a group without valid pixels is left out (the references would divide by zero)
    means = {
        name: torch.where(has, _per_group(s.double(), ids, count) / valid.clamp_min(1), 0.0).sum()
        for name, s in (("abs_err", abs_sum), ("rel_err", rel_sum))
    }
    return {**means, "count": has.sum()}


def depth_summary(sums: dict[str, Tensor], n: int) -> dict[str, Tensor]:
    count = sums["count"].double()
    return {name: (sums[name].double() / count).float() for name in ("abs_err", "rel_err")}


def normal_angles(pred: Tensor, target: Tensor) -> Tensor:
    """(N, H, W) angle in degrees between the unit prediction and the target (cosine clamped to [-1, 1])."""
    cosine = (F.normalize(pred.float(), dim=1) * target.float()).sum(dim=1)
    return torch.rad2deg(torch.acos(cosine.clamp(-1, 1)))


def _group_medians(angles: Tensor, mask: Tensor, group: int, valid: Tensor, chunk: int = 32) -> Tensor:
    """Exact median (numpy's) of each group's valid angles; `valid` (G,) the counts. Invalid pixels sort last."""
    n = len(angles)
    count = (n + group - 1) // group
    flat = torch.where(mask, angles, math.inf).flatten(1)
    pad = count * group - n
    if pad:
        flat = torch.cat([flat, flat.new_full((pad, flat.shape[1]), math.inf)])
    flat = flat.reshape(count, -1)
    low = ((valid - 1) // 2).clamp_min(0).long()
    high = (valid // 2).clamp(max=flat.shape[1] - 1).long()
    medians = []
    for start in range(0, count, chunk):  # bounds the sort's memory
        ordered = flat[start : start + chunk].sort(dim=1).values
        rows = slice(start, start + chunk)
        pair = ordered.gather(1, torch.stack([low[rows], high[rows]], dim=1))
        medians.append(pair.mean(dim=1))
    return torch.cat(medians)


@torch.no_grad()
def normal_metrics(pred: Tensor, target: Tensor, error_batch: Optional[int]) -> dict[str, Tensor]:
    """Angle sums, below-threshold counts and a histogram (error_batch None), or sums of per-group values."""
    check_shapes(pred, target)
    angles = normal_angles(pred, target)
    mask = valid_pixels(target).squeeze(1)
    valid = mask.flatten(1).sum(1).double()
    per_sample = {"angle_mean": torch.where(mask, angles, 0.0).flatten(1).sum(1).double()}
    for name, limit in ANGLE_THRESHOLDS.items():
        per_sample[name] = (mask & (angles < limit)).flatten(1).sum(1).double()
    if error_batch is None:
        # invalid pixels go to an extra bin that is dropped (no boolean indexing: no host sync on CUDA)
        bins = torch.where(mask, (angles / HIST_BIN_DEGREES).long().clamp(0, HIST_BINS - 1), HIST_BINS).flatten()
        histogram = torch.zeros(HIST_BINS + 1, dtype=torch.int64, device=pred.device)
        histogram.scatter_add_(0, bins, torch.ones_like(bins))
        return {**{k: v.sum() for k, v in per_sample.items()}, "count": valid.sum(), "histogram": histogram[:HIST_BINS]}
    ids, count = _groups(len(pred), error_batch, pred.device)
    group_valid = _per_group(valid, ids, count)
    has = group_valid > 0
    sums = {
        k: torch.where(has, _per_group(v, ids, count) / group_valid.clamp_min(1), 0.0).sum()
        for k, v in per_sample.items()
    }
    medians = _group_medians(angles, mask, error_batch, group_valid)
    sums["angle_median"] = torch.where(has, medians.double(), 0.0).sum()
    return {**sums, "count": has.sum()}


def histogram_median(histogram: Tensor, width: float = HIST_BIN_DEGREES) -> Tensor:
    """numpy's median (mean of the two middle ranks) of values binned in `histogram`, each rank placed
    within its bin by linear interpolation: less than one bin width from the exact median."""
    h = histogram.double()
    cdf = h.cumsum(0)
    total = cdf[-1]
    ranks = torch.stack([torch.floor((total - 1) / 2), torch.floor(total / 2)])  # 0-based middle ranks
    bins = torch.searchsorted(cdf, ranks, right=True).clamp(max=len(h) - 1)
    before = torch.where(bins > 0, cdf[(bins - 1).clamp_min(0)], 0.0)
    values = (bins + (ranks - before + 0.5) / h[bins].clamp_min(1)) * width
    return torch.where(total > 0, values.mean(), math.nan)


def normal_summary(sums: dict[str, Tensor], n: int) -> dict[str, Tensor]:
    count = sums["count"].double()
    out = {name: sums[name].double() / count for name in ("angle_mean", *ANGLE_THRESHOLDS)}
    out["angle_median"] = (
        histogram_median(sums["histogram"]) if "histogram" in sums else sums["angle_median"].double() / count
    )
    order = ("angle_mean", "angle_median", *ANGLE_THRESHOLDS)
    return {name: out[name].float() for name in order}
