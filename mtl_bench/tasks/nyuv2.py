"""NYUv2 (Silberman et al. 2012) as the MTL literature uses it: 13-class segmentation, depth and surface
normals at 288x384, in the preprocessed layout of MTAN (Liu et al. 2019), which LibMTL, CAGrad, Nash-MTL and
FAMO read unchanged: `{train,val}/{image,label,depth,normal}/<i>.npy` (795 train, 654 val images);
image (288, 384, 3) float, label (288, 384) float with -1 = ignored, depth (288, 384, 1) float (0 = invalid),
normal (288, 384, 3) float (all zero = invalid). Nothing is downloaded: `tasks.root` is that tree.

Splits: `train` is train/ (MTAN's random scale-crop and flip when `augment`), `test` is val/ (the references
test on it); `val` is the test split, or with `val_fraction` > 0 a seeded hold-out of train/.
Losses and metrics: `mtl_bench/tasks/dense/`.
"""

from __future__ import annotations

from typing import Mapping, Optional

from mtl_bench.tasks.base import TaskSet
from mtl_bench.tasks.dense.tasks import depth_task, normal_task, segmentation_task
from mtl_bench.tasks.dense.tree import Layout, build_splits

LAYOUT = Layout(name="NYUv2", option="nyuv2", height=288, width=384, label="label", num_classes=13, normal=True)


class NYUv2(TaskSet):
    """Tasks `segmentation` (13 classes: miou, pixel_acc), `depth` (abs_err, rel_err) and `normal`
    (angle_mean, angle_median, within_11_25, within_22_5, within_30); inputs (3, 288, 384)."""

    def __init__(
        self,
        root: Optional[str] = None,
        augment: bool = True,
        val_fraction: float = 0.0,
        split_seed: int = 0,
        error_batch: Optional[int] = 2,
        reference: Optional[Mapping[str, Mapping[str, float]]] = None,
    ) -> None:
        """
        root: the preprocessed tree (holds train/ and val/); checked here: folders, file counts, every file's
            shape and dtype.
        augment: MTAN's random scale-crop (1, 1.2, 1.5) and horizontal flip on training images (default on, as
            Nash-MTL, CAGrad and FAMO train).
        val_fraction: 0: val is the test split (val/); > 0: that fraction of train/ held out as val (seeded).
        split_seed: seed of the hold-out.
        error_batch: depth and normal errors averaged per group of this many test images, then over groups, as
            MTAN, CAGrad and Nash-MTL's test loop (batch size 2) computes the published numbers; null: over all
            valid pixels of the split, as LibMTL.
        reference: single-task metrics {task: {metric: value}} for `mtl-bench report -b reference`.
        """
        train, val, test = build_splits(root, LAYOUT, augment, val_fraction, split_seed)
        tasks = [segmentation_task(LAYOUT.num_classes), depth_task(error_batch), normal_task(error_batch)]
        super().__init__(tasks, (3, LAYOUT.height, LAYOUT.width), train, val, test, reference=reference)
