"""Dense prediction: segmentation, depth and surface-normal tasks (losses, metrics) and the reader of the
preprocessed `.npy` trees of NYUv2 and Cityscapes, with MTAN's augmentation.

The definitions are those of MTAN (github.com/lorenmt/mtan, im2im_pred/utils.py and create_dataset.py at
c36c30b), copied unchanged by CAGrad (Cranial-XIX/CAGrad), Nash-MTL (AvivNavon/nash-mtl,
experiments/nyuv2/utils.py at cce1840) and FAMO (Cranial-XIX/FAMO); LibMTL (median-research-group/LibMTL,
examples/nyu/utils.py at 4336804) differs only in how depth and normal errors are averaged (below).

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

import functools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import Dataset

from mtl_bench.tasks.base import Task, root_folder

IGNORE_INDEX = -1
ANGLE_THRESHOLDS = {"within_11_25": 11.25, "within_22_5": 22.5, "within_30": 30.0}
HIST_BIN_DEGREES = 0.01
HIST_BINS = 18000  # 0..180 degrees
SCALES = (1.0, 1.2, 1.5)  # MTAN's RandomScaleCrop


# --------------------------------------------------------------------------- losses


def _check_shapes(pred: Tensor, target: Tensor, segmentation: bool = False) -> None:
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
    _check_shapes(pred, target, segmentation=True)
    return F.cross_entropy(pred, target, ignore_index=IGNORE_INDEX)


def depth_loss(pred: Tensor, target: Tensor) -> Tensor:
    """Mean |pred - target| over valid pixels."""
    _check_shapes(pred, target)
    mask = valid_pixels(target)
    return ((pred - target).abs() * mask).sum() / mask.sum().clamp_min(1)


def normal_loss(pred: Tensor, target: Tensor) -> Tensor:
    """1 - mean cosine over valid pixels, of the unit-length prediction and the target."""
    _check_shapes(pred, target)
    mask = valid_pixels(target)
    return 1 - (F.normalize(pred, dim=1) * target * mask).sum() / mask.sum().clamp_min(1)


# --------------------------------------------------------------------------- metrics


@torch.no_grad()
def segmentation_metrics(pred: Tensor, target: Tensor, num_classes: int) -> dict[str, Tensor]:
    """{"confusion": (C, C) counts}: rows the target class, columns the arg-max prediction."""
    _check_shapes(pred, target, segmentation=True)
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
    _check_shapes(pred, target)
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
    _check_shapes(pred, target)
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


# --------------------------------------------------------------------------- tasks


def check_error_batch(error_batch: Optional[int]) -> None:
    if error_batch is not None and (
        isinstance(error_batch, bool) or not isinstance(error_batch, int) or error_batch < 1
    ):
        raise ValueError(
            f"error_batch: must be a number of images >= 1 (errors averaged per group of that many "
            f"test images, as the references' test batches) or null (over all pixels), "
            f"got {error_batch!r}"
        )


def segmentation_task(num_classes: int, name: str = "segmentation") -> Task:
    return Task(
        name=name,
        out_dim=num_classes,
        loss=segmentation_loss,
        metrics=functools.partial(segmentation_metrics, num_classes=num_classes),
        higher_is_better={"miou": True, "pixel_acc": True},
        initial_loss=math.log(num_classes),
        summarize=segmentation_summary,
    )


def depth_task(error_batch: Optional[int], name: str = "depth") -> Task:
    check_error_batch(error_batch)
    return Task(
        name=name,
        out_dim=1,
        loss=depth_loss,
        metrics=functools.partial(depth_metrics, error_batch=error_batch),
        higher_is_better={"abs_err": False, "rel_err": False},
        summarize=depth_summary,
    )


def normal_task(error_batch: Optional[int], name: str = "normal") -> Task:
    check_error_batch(error_batch)
    higher = {"angle_mean": False, "angle_median": False, **{k: True for k in ANGLE_THRESHOLDS}}
    return Task(
        name=name,
        out_dim=3,
        loss=normal_loss,
        metrics=functools.partial(normal_metrics, error_batch=error_batch),
        higher_is_better=higher,
        summarize=normal_summary,
    )


# --------------------------------------------------------------------------- augmentation


def scale_crop(
    image: Tensor, label: Tensor, depth: Tensor, normal: Optional[Tensor], scale: float, top: int, left: int
) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """MTAN's RandomScaleCrop with its draws given: the (H/scale, W/scale) window at (top, left) resized back to
    (H, W); image and normal bilinear (align_corners=True), label and depth nearest, depth divided by scale."""
    height, width = image.shape[-2:]
    h, w = int(height / scale), int(width / scale)
    window = (slice(None), slice(None), slice(top, top + h), slice(left, left + w))  # of (1, C, H, W)
    smooth = image if normal is None else torch.cat([image, normal])
    smooth = F.interpolate(smooth[None][window], size=(height, width), mode="bilinear", align_corners=True)[0]
    nearest = torch.cat([label[None], depth])
    nearest = F.interpolate(nearest[None][window], size=(height, width), mode="nearest")[0]
    image_out = smooth[: len(image)]
    normal_out = None if normal is None else smooth[len(image) :]
    return image_out, nearest[0], nearest[1:] / scale, normal_out


def hflip(
    image: Tensor, label: Tensor, depth: Tensor, normal: Optional[Tensor]
) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """Mirror left-right; a normal's x component changes sign."""
    if normal is not None:
        normal = normal.flip(-1)
        normal[0] = -normal[0]
    return image.flip(-1), label.flip(-1), depth.flip(-1), normal


def mtan_augment(
    image: Tensor, label: Tensor, depth: Tensor, normal: Optional[Tensor], generator: Optional[torch.Generator] = None
) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """MTAN's training augmentation: random scale-crop (scale 1, 1.2 or 1.5, uniform window), then a
    horizontal flip with probability 1/2. The draws come from `generator` (torch's global one when None; MTAN
    draws the crop from Python's `random`, same distributions)."""
    height, width = image.shape[-2:]
    scale = SCALES[int(torch.randint(len(SCALES), (), generator=generator))]
    h, w = int(height / scale), int(width / scale)
    top = int(torch.randint(height - h + 1, (), generator=generator))
    left = int(torch.randint(width - w + 1, (), generator=generator))
    image, label, depth, normal = scale_crop(image, label, depth, normal, scale, top, left)
    if torch.rand(1, generator=generator) < 0.5:
        image, label, depth, normal = hflip(image, label, depth, normal)
    return image, label, depth, normal


# --------------------------------------------------------------------------- the preprocessed tree


@dataclass(frozen=True)
class Layout:
    """A preprocessed tree `{train,val}/<folder>/<i>.npy`: each folder's array shape and dtype."""

    name: str  # "NYUv2"
    option: str  # "nyuv2"
    height: int
    width: int
    label: str  # the folder of segmentation labels
    num_classes: int
    normal: bool  # has a normal/ folder

    @property
    def folders(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """folder -> (shape, dtype kinds numpy may use: 'f' float, 'i' signed int)."""
        hw = (self.height, self.width)
        folders = {"image": ((*hw, 3), "f"), self.label: (hw, "fi"), "depth": ((*hw, 1), "f")}
        if self.normal:
            folders["normal"] = ((*hw, 3), "f")
        return folders

    def describe(self) -> str:
        return (
            f"the {self.name} layout {{train,val}}/{{{','.join(self.folders)}}}/<i>.npy at {self.height}x{self.width}"
        )


KIND_NAMES = {"f": "float", "fi": "float or signed int"}
_NPY = re.compile(r"^(\d+)\.npy$")


def _fail(message: str, layout: Layout) -> ValueError:
    return ValueError(f"root: {message}; expected {layout.describe()}")


def _expected(shape: tuple[int, ...], kinds: str) -> str:
    return f"shape {shape} dtype {KIND_NAMES[kinds]}"


def check_array(path: Path, array: np.ndarray | _Header, shape: tuple[int, ...], kinds: str, layout: Layout) -> None:
    if tuple(array.shape) != shape or array.dtype.kind not in kinds:
        raise _fail(f"{path} has shape {tuple(array.shape)} dtype {array.dtype}, not {_expected(shape, kinds)}", layout)


def scan_split(split_dir: Path, layout: Layout) -> int:
    """Check a split's folders: the same files 0.npy..n-1.npy in each, every file's header (shape, dtype;
    read without loading the data) and the first label's values. Returns n."""
    if not split_dir.is_dir():
        raise _fail(f"{split_dir} is not a directory", layout)
    present = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    missing = [f for f in layout.folders if f not in present]
    if missing:
        hint = _guess_layout(present)
        raise _fail(
            f"{split_dir} has no {', '.join(missing)} folder (it has: {', '.join(present) or 'nothing'}){hint}", layout
        )
    count = None
    for folder, (shape, kinds) in layout.folders.items():
        directory = split_dir / folder
        names = [name for name in os.listdir(directory) if name.endswith(".npy")]
        if not names:
            raise _fail(f"{directory} holds no .npy files", layout)
        numbers = sorted(int(m.group(1)) for m in map(_NPY.match, names) if m)
        if len(numbers) != len(names) or numbers != list(range(len(numbers))):
            wanted = set(range(len(names)))
            odd = sorted(set(names) - {f"{i}.npy" for i in wanted})[:3]
            raise _fail(
                f"{directory} holds {len(names)} .npy files that are not 0.npy..{len(names) - 1}.npy "
                f"(e.g. {', '.join(odd)})",
                layout,
            )
        if count is None:
            count, first = len(names), directory
        elif len(names) != count:
            raise _fail(f"{directory} holds {len(names)} .npy files but {first} holds {count}", layout)
        for i in range(count):
            path = directory / f"{i}.npy"
            check_array(path, _header(path, layout), shape, kinds, layout)
    assert count is not None
    _check_labels(split_dir / layout.label / "0.npy", layout)
    return count


class _Header:
    """What a .npy header says: shape and dtype (what `check_array` reads)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape, self.dtype = shape, dtype


def _header(path: Path, layout: Layout) -> _Header:
    """Shape and dtype from the file's .npy header, the data not read; a file shorter than its header says is
    an error (truncated copy)."""
    with open(path, "rb") as file:
        if file.read(6) != b"\x93NUMPY":
            raise _fail(f"{path} is not a .npy file (no NumPy header)", layout)
        file.seek(0)
        try:
            version = np.lib.format.read_magic(file)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(file)
        except Exception as err:  # a header numpy cannot read
            raise _fail(f"{path} is not a readable .npy file ({str(err).splitlines()[0]})", layout) from None
        size = file.tell() + dtype.itemsize * math.prod(shape)
    actual = os.path.getsize(path)
    if actual < size:
        raise _fail(f"{path} is not a readable .npy file (truncated: {actual} bytes, its header needs {size})", layout)
    return _Header(tuple(shape), dtype)


def _check_labels(path: Path, layout: Layout) -> None:
    labels = np.load(path, allow_pickle=False)
    values = np.unique(labels)
    bad = values[(values != np.round(values)) | (values < IGNORE_INDEX) | (values >= layout.num_classes)]
    if len(bad):
        raise _fail(
            f"{path} holds label values {bad[:5].tolist()}, not class indices 0..{layout.num_classes - 1} "
            f"or {IGNORE_INDEX} (ignored)",
            layout,
        )


def _guess_layout(folders: Sequence[str]) -> str:
    if "label_7" in folders and "normal" not in folders:
        return " (a Cityscapes tree? that is tasks=cityscapes)"
    if "normal" in folders and "label" in folders:
        return " (an NYUv2 tree? that is tasks=nyuv2)"
    return ""


class DenseTree(Dataset):
    """Items `(image (3, H, W) float32, {"segmentation": (H, W) int64, "depth": (1, H, W) float32,
    ["normal": (3, H, W) float32]})` of samples `indices` of one split folder, MTAN-augmented if `augment`."""

    def __init__(self, split_dir: Path, layout: Layout, indices: Sequence[int], augment: bool = False) -> None:
        self.split_dir, self.layout, self.indices, self.augment = Path(split_dir), layout, list(indices), augment

    def __len__(self) -> int:
        return len(self.indices)

    def _load(self, folder: str, i: int) -> np.ndarray:
        shape, kinds = self.layout.folders[folder]
        path = self.split_dir / folder / f"{i}.npy"
        array = np.load(path, allow_pickle=False)
        check_array(path, array, shape, kinds, self.layout)  # a file changed since the constructor's check
        return array

    def __getitem__(self, k: int) -> tuple[Tensor, dict[str, Tensor]]:
        i = self.indices[k]
        image = torch.from_numpy(self._load("image", i)).permute(2, 0, 1).float()
        label = torch.from_numpy(self._load(self.layout.label, i)).float()
        depth = torch.from_numpy(self._load("depth", i)).permute(2, 0, 1).float()
        normal = torch.from_numpy(self._load("normal", i)).permute(2, 0, 1).float() if self.layout.normal else None
        if self.augment:
            # The engine's indices carry the key of their draw (engine/data.py SampleIndex): the same draw is
            # augmented alike with any number of loader workers and across a resume.
            key = getattr(k, "key", None)
            generator = None if key is None else torch.Generator().manual_seed(key)
            image, label, depth, normal = mtan_augment(image, label, depth, normal, generator)
        targets = {"segmentation": label.long(), "depth": depth.contiguous()}
        if normal is not None:
            targets["normal"] = normal.contiguous()
        return image.contiguous(), targets


def build_splits(
    root: Optional[str], layout: Layout, augment: bool, val_fraction: float, split_seed: int
) -> tuple[DenseTree, DenseTree, DenseTree]:
    """train (augmented if asked), val and test (= the tree's val/, as in every reference).

    val_fraction 0: val is the test split (the references have no validation split; mtl-bench selects the
    final step, so val only feeds the log). val_fraction > 0: a seeded hold-out of that fraction of train/,
    not augmented and not trained on.
    """
    if isinstance(val_fraction, bool) or not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction: must be in [0, 1), got {val_fraction!r}")
    path = root_folder(root, "train/ and val/", layout.option, f"expected {layout.describe()}")
    n_train = scan_split(path / "train", layout)
    n_test = scan_split(path / "val", layout)
    test = DenseTree(path / "val", layout, range(n_test))
    if val_fraction == 0:
        return DenseTree(path / "train", layout, range(n_train), augment), test, test
    n_val = round(val_fraction * n_train)
    if not 1 <= n_val < n_train:
        raise ValueError(
            f"val_fraction: {val_fraction} of {n_train} training images leaves {n_val} for val and "
            f"{n_train - n_val} for train; both need at least 1"
        )
    order = torch.randperm(n_train, generator=torch.Generator().manual_seed(split_seed)).tolist()
    val_indices, train_indices = sorted(order[:n_val]), sorted(order[n_val:])
    return (
        DenseTree(path / "train", layout, train_indices, augment),
        DenseTree(path / "train", layout, val_indices),
        test,
    )
