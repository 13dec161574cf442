"""Tiny NYUv2 and Cityscapes trees in the real preprocessed format (MTAN's `{train,val}/<folder>/<i>.npy`,
real shapes and dtypes, a few samples), and a tiny dense model for training on them in tests."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from torch import nn

from mtl_bench.models import MultiTaskModel

NYUV2 = {"height": 288, "width": 384, "classes": 13, "label": "label", "normal": True}
CITYSCAPES = {"height": 128, "width": 256, "classes": 7, "label": "label_7", "normal": False}


def sample(
    rng: np.random.Generator, height: int, width: int, classes: int, normal: bool, dtype: type = np.float32
) -> dict[str, np.ndarray]:
    """One sample: image in [0, 1], labels -1..classes-1 (some ignored), depth > 0 with invalid zeros, unit
    normals with invalid all-zero pixels."""
    image = rng.random((height, width, 3)).astype(dtype)
    label = rng.integers(-1, classes, (height, width)).astype(dtype)
    depth = rng.uniform(0.5, 8.0, (height, width, 1)).astype(dtype)
    depth[rng.random((height, width)) < 0.1] = 0
    arrays = {"image": image, "label": label, "depth": depth}
    if normal:
        vectors = rng.normal(size=(height, width, 3))
        vectors /= np.linalg.norm(vectors, axis=-1, keepdims=True)
        vectors[rng.random((height, width)) < 0.1] = 0
        arrays["normal"] = vectors.astype(dtype)
    return arrays


def write_tree(
    root: Path, spec: dict, n_train: int = 4, n_val: int = 2, seed: int = 0, dtype: type = np.float32
) -> Path:
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        for i in range(n):
            arrays = sample(rng, spec["height"], spec["width"], spec["classes"], spec["normal"], dtype)
            for kind, array in arrays.items():
                folder = root / split / (spec["label"] if kind == "label" else kind)
                folder.mkdir(parents=True, exist_ok=True)
                np.save(folder / f"{i}.npy", array)
    return root


def write_nyuv2(root: Path, **kwargs) -> Path:
    return write_tree(root, NYUV2, **kwargs)


def write_cityscapes(root: Path, **kwargs) -> Path:
    return write_tree(root, CITYSCAPES, **kwargs)


class TinyDense(MultiTaskModel):
    """A 1x1-conv trunk and 1x1-conv heads: (N, C, H, W) in, (N, heads[task], H, W) out per task."""

    def __init__(self, input_shape: Sequence[int], heads: dict[str, int], width: int = 4) -> None:
        conv = nn.Conv2d(input_shape[0], width, 1)
        trunk = nn.Sequential(conv, nn.ReLU())
        super().__init__(trunk, {task: nn.Conv2d(width, out, 1) for task, out in heads.items()}, last_shared_layer=conv)
