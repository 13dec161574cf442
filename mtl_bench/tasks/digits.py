"""MultiMNIST-style digit pairs (MultiMNIST: Sabour et al. 2017, as used for MTL by Sener & Koltun 2018).

Built from scikit-learn's bundled 8x8 digits (`load_digits`: 1797 real images, values 0..16, no download).
The 1797 source images are first split into disjoint train/val/test pools (70/15/15 %, seeded permutation),
so no val/test image is ever seen in training. Each sample draws two images (with replacement) from its
split's pool and puts them on one 8 x (16 - overlap) canvas: the left image at columns 0..7, the right one
at columns 8-overlap..15-overlap, combined by element-wise max (as MultiMNIST overlays digits), scaled to
[0, 1]. Input shape (1, 8, 16 - overlap).

Tasks: "left" and "right" (10-class cross-entropy; metric "accuracy", a per-batch count of correct
predictions) and "sum" (regression of left + right digit, float target of shape (N, 1); loss MSE, metric
"mse"), so the losses differ in kind and in scale.

The scale imbalance, measured with LeNet (experiment=digits_lenet, seed 0): untrained, the sum's MSE is ~101
(E[sum^2] = 16.5 + 9^2) against ln 10 = 2.30 for each classifier, 44x; a model that has learned only the mean
has MSE Var(sum) = 16.5, 7x; after the preset's 1,500 steps with equal weights 3.9 against ~1.1, 3.6x. With equal
weights the sum's gradient dominates the shared trunk early on, and LeNet at lr 1e-3 stays at chance on the digits
for its first ~300 steps. `standardize_sum=true` trains the sum on (sum - 9) / sqrt(16.5), the exact mean and
standard deviation of the sum of two independent uniform digits (no statistics of the data are used); its loss is
then ~1 for a constant predictor, and its metric "mse" is still reported in the original units (squared digits):
the prediction is mapped back before the error is taken.
"""

from __future__ import annotations

import functools
import math
from typing import Mapping, Optional

import torch
from torch import Generator, Tensor

from mtl_bench.tasks.base import Split, Task, TaskSet
from mtl_bench.tasks.losses import accuracy_metrics, cross_entropy_loss, mse_loss, mse_metrics

POOL_FRACTIONS = (0.70, 0.15)  # train, val; test gets the rest
SIDE = 8  # load_digits images are 8x8
# The sum of two independent digits uniform on 0..9: mean 2 * 4.5, variance 2 * (10^2 - 1) / 12 = 16.5.
SUM_MEAN, SUM_STD = 9.0, math.sqrt(16.5)


def original_units_mse(pred: Tensor, target: Tensor) -> dict[str, Tensor]:
    """The sum's mse metric in squared digits from a standardised prediction and target."""
    return mse_metrics(pred * SUM_STD + SUM_MEAN, target * SUM_STD + SUM_MEAN)


def source_pools(data_seed: int = 0) -> dict[str, Tensor]:
    """Indices into `load_digits()` of each split's source images: disjoint, together all 1797."""
    return _pools(torch.Generator().manual_seed(data_seed))


class Digits(TaskSet):
    """MultiMNIST-style pairs: tasks left, right (10-class) and sum (regression); see the module docstring."""

    def __init__(
        self,
        n_train: int = 10000,
        n_val: int = 2000,
        n_test: int = 2000,
        overlap: int = 4,
        data_seed: int = 0,
        standardize_sum: bool = False,
        reference: Optional[Mapping[str, Mapping[str, float]]] = None,
    ) -> None:
        """
        n_train: training pairs (> 0).
        n_val: validation pairs (> 0).
        n_test: test pairs (> 0).
        overlap: columns the two digits share, 0..8.
        data_seed: seed of the pools and pairs (the same data in every run).
        standardize_sum: train the sum on (sum - 9) / sqrt(16.5) (loss ~1 for a constant predictor instead of 16.5);
            its metric mse stays in the original units.
        reference: single-task metrics {task: {metric: value}} for `mtl-bench report -b reference`.
        """
        if not 0 <= overlap <= SIDE:
            raise ValueError(f"overlap: must be 0..{SIDE} columns, got {overlap!r}")
        for key, value in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
            if not value > 0:
                raise ValueError(f"{key}: must be > 0, got {value}")
        images, labels = _load()
        gen = torch.Generator().manual_seed(data_seed)
        pools = _pools(gen)  # drawn first from the same generator, so source_pools(data_seed) matches
        splits = {}
        for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
            pool = pools[split]
            pick = pool[torch.randint(len(pool), (n, 2), generator=gen)]  # (n, 2) source indices
            left, right = pick[:, 0], pick[:, 1]
            targets = {
                "left": labels[left],
                "right": labels[right],
                "sum": (labels[left] + labels[right]).float().unsqueeze(1),  # (N, 1), like the head's output
            }
            if standardize_sum:
                targets["sum"] = (targets["sum"] - SUM_MEAN) / SUM_STD
            splits[split] = Split(inputs=_compose(images[left], images[right], overlap), targets=targets)
        classify = dict(
            out_dim=10,
            loss=cross_entropy_loss,
            metrics=accuracy_metrics,
            higher_is_better={"accuracy": True},
            initial_loss=math.log(10),
        )
        tasks = [
            Task(name="left", **classify),  # type: ignore[arg-type]
            Task(name="right", **classify),  # type: ignore[arg-type]
            Task(
                name="sum",
                out_dim=1,
                loss=mse_loss,
                metrics=original_units_mse if standardize_sum else mse_metrics,
                higher_is_better={"mse": False},
            ),
        ]
        super().__init__(tasks, (1, SIDE, 2 * SIDE - overlap), reference=reference, **splits)


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Tensor, Tensor]:
    """(images (1797, 8, 8) float32 in [0, 1], labels (1797,) int64); cached: sklearn is slow to import."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return torch.from_numpy(digits.images).float() / 16.0, torch.from_numpy(digits.target).long()


def _pools(gen: Generator) -> dict[str, Tensor]:
    n = len(_load()[1])
    order = torch.randperm(n, generator=gen)
    n_train, n_val = round(POOL_FRACTIONS[0] * n), round(POOL_FRACTIONS[1] * n)
    return {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}


def _compose(left: Tensor, right: Tensor, overlap: int) -> Tensor:
    """(N, 1, 8, 16 - overlap) canvases from (N, 8, 8) left and right images."""
    width = 2 * SIDE - overlap
    canvas = torch.zeros(len(left), 1, SIDE, width)
    canvas[:, 0, :, :SIDE] = left
    canvas[:, 0, :, width - SIDE :] = torch.maximum(canvas[:, 0, :, width - SIDE :], right)
    return canvas
