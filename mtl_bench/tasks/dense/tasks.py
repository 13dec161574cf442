"""The three dense tasks (segmentation, depth, surface normals): each one's loss, metrics and summary bound
into a `Task` (definitions in `losses` and `metrics`)."""

from __future__ import annotations

import functools
import math
from typing import Optional

from mtl_bench.tasks.base import Task
from mtl_bench.tasks.dense.losses import depth_loss, normal_loss, segmentation_loss
from mtl_bench.tasks.dense.metrics import (
    ANGLE_THRESHOLDS,
    depth_metrics,
    depth_summary,
    normal_metrics,
    normal_summary,
    segmentation_metrics,
    segmentation_summary,
)


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
