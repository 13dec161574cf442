"""Cityscapes (Cordts et al. 2016) as the MTL literature uses it: 7-class segmentation and depth (inverse
depth: the dataset's disparity) at 128x256, in MTAN's preprocessed layout (Liu et al. 2019), read by CAGrad,
Nash-MTL and FAMO: `{train,val}/{image,label_7,depth}/<i>.npy` (2975 train, 500 val images); image
(128, 256, 3) float, label_7 (128, 256) float with -1 = ignored, depth (128, 256, 1) float (0 = invalid).
Nothing is downloaded: `tasks.root` is that tree.

Splits: `train` is train/ (MTAN's random scale-crop and flip when `augment`), `test` is val/ (the references
test on it); `val` is the test split, or with `val_fraction` > 0 a seeded hold-out of train/.
Losses and metrics: `mtl_bench/tasks/dense/`.
"""

from __future__ import annotations

from typing import Mapping, Optional

from mtl_bench.tasks.base import TaskSet
from mtl_bench.tasks.dense.tasks import depth_task, segmentation_task
from mtl_bench.tasks.dense.tree import Layout, build_splits

LAYOUT = Layout(
    name="Cityscapes", option="cityscapes", height=128, width=256, label="label_7", num_classes=7, normal=False
)


class Cityscapes(TaskSet):
    """Tasks `segmentation` (7 classes: miou, pixel_acc) and `depth` (abs_err, rel_err); inputs (3, 128, 256)."""

    def __init__(
        self,
        root: Optional[str] = None,
        augment: bool = True,
        val_fraction: float = 0.0,
        split_seed: int = 0,
        error_batch: Optional[int] = 8,
        reference: Optional[Mapping[str, Mapping[str, float]]] = None,
    ) -> None:
        """
        root: the preprocessed tree (holds train/ and val/); checked here: folders, file counts, every file's
            shape and dtype.
        augment: MTAN's random scale-crop (1, 1.2, 1.5) and horizontal flip on training images (default on, as
            Nash-MTL, CAGrad and FAMO train).
        val_fraction: 0: val is the test split (val/); > 0: that fraction of train/ held out as val (seeded).
        split_seed: seed of the hold-out.
        error_batch: depth errors averaged per group of this many test images, then over groups, as CAGrad,
            Nash-MTL and FAMO's test loop (batch size 8) computes the published numbers; null: over all valid
            pixels of the split, as LibMTL.
        reference: single-task metrics {task: {metric: value}} for `mtl-bench report -b reference`.
        """
        train, val, test = build_splits(root, LAYOUT, augment, val_fraction, split_seed)
        tasks = [segmentation_task(LAYOUT.num_classes), depth_task(error_batch)]
        super().__init__(tasks, (3, LAYOUT.height, LAYOUT.width), train, val, test, reference=reference)
