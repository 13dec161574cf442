"""Dense prediction, shared by NYUv2 and Cityscapes: `losses` (which pixels count), `metrics` (mIoU, depth and
normal errors, how they are averaged), `tasks` (the three tasks built from them), `augment` (MTAN's
augmentation) and `tree` (the preprocessed `.npy` trees: checks, dataset, splits).

The definitions are those of MTAN (github.com/lorenmt/mtan, im2im_pred/utils.py and create_dataset.py at
c36c30b), copied unchanged by CAGrad (Cranial-XIX/CAGrad), Nash-MTL (AvivNavon/nash-mtl,
experiments/nyuv2/utils.py at cce1840) and FAMO (Cranial-XIX/FAMO); LibMTL (median-research-group/LibMTL,
examples/nyu/utils.py at 4336804) differs only in how depth and normal errors are averaged (see `metrics`).
"""

from mtl_bench.tasks.dense.augment import SCALES, hflip, mtan_augment, scale_crop
from mtl_bench.tasks.dense.losses import IGNORE_INDEX, depth_loss, normal_loss, segmentation_loss, valid_pixels
from mtl_bench.tasks.dense.metrics import (
    ANGLE_THRESHOLDS,
    HIST_BIN_DEGREES,
    HIST_BINS,
    depth_metrics,
    depth_summary,
    histogram_median,
    normal_angles,
    normal_metrics,
    normal_summary,
    segmentation_metrics,
    segmentation_summary,
)
from mtl_bench.tasks.dense.tasks import check_error_batch, depth_task, normal_task, segmentation_task
from mtl_bench.tasks.dense.tree import DenseTree, Layout, build_splits, scan_split

__all__ = [
    "ANGLE_THRESHOLDS",
    "DenseTree",
    "HIST_BINS",
    "HIST_BIN_DEGREES",
    "IGNORE_INDEX",
    "Layout",
    "SCALES",
    "build_splits",
    "check_error_batch",
    "depth_loss",
    "depth_metrics",
    "depth_summary",
    "depth_task",
    "hflip",
    "histogram_median",
    "mtan_augment",
    "normal_angles",
    "normal_loss",
    "normal_metrics",
    "normal_summary",
    "normal_task",
    "scale_crop",
    "scan_split",
    "segmentation_loss",
    "segmentation_metrics",
    "segmentation_summary",
    "segmentation_task",
    "valid_pixels",
]
