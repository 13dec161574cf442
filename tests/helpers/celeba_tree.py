"""Tiny CelebA trees in the real format: 178x218 RGB JPEGs in img_align_celeba/, list_attr_celeba.txt (count line,
the 40 names with the release's trailing space, `000001.jpg -1  1 ...` rows with values printed %2d) and
list_eval_partition.txt (`000001.jpg 0`), in torchvision's layout (files in the folder, or in celeba/ below it) or
the original release's (Img/, Anno/, Eval/)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from PIL import Image

from mtl_bench.tasks.celeba import ATTRIBUTES, HEIGHT, WIDTH

ORIGINAL = {
    "images": "Img/img_align_celeba",
    "attr": "Anno/list_attr_celeba.txt",
    "partition": "Eval/list_eval_partition.txt",
}
FLAT = {"images": "img_align_celeba", "attr": "list_attr_celeba.txt", "partition": "list_eval_partition.txt"}


def image(rng: np.random.Generator) -> Image.Image:
    """178x218 RGB: a smooth colour gradient plus noise (so resizing has something to average)."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    base = np.stack(
        [
            (x * rng.uniform(0.5, 1.4)) % 256,
            (y * rng.uniform(0.5, 1.1)) % 256,
            np.full_like(x, rng.integers(0, 256), dtype=float),
        ]
    )
    noisy = base + rng.normal(0, 25, base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8).transpose(1, 2, 0), mode="RGB")


def write_celeba(
    root: Path,
    n: int = 6,
    seed: int = 0,
    layout: str = "flat",
    partition: Optional[Sequence[int]] = None,
    newline: str = "\n",
) -> Path:
    """`n` images 000001.jpg... with random attributes; partition 0 (train) for the first half, then 1 (val),
    then 2 (test), unless given. layout: "flat" (files in root), "torchvision" (root/celeba/...), "original"
    (Img/, Anno/, Eval/). Returns the folder that holds the files."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    folder = root / "celeba" if layout == "torchvision" else root
    paths = {k: folder / v for k, v in (ORIGINAL if layout == "original" else FLAT).items()}
    paths["images"].mkdir(parents=True, exist_ok=True)
    paths["attr"].parent.mkdir(parents=True, exist_ok=True)
    paths["partition"].parent.mkdir(parents=True, exist_ok=True)
    names = [f"{i + 1:06d}.jpg" for i in range(n)]
    if partition is None:
        n_train, n_val = max(1, n // 2), max(1, (n - n // 2) // 2)
        partition = [0] * n_train + [1] * n_val + [2] * (n - n_train - n_val)
    values = rng.choice([-1, 1], size=(n, len(ATTRIBUTES)))
    rows = [f"{name} " + " ".join(f"{v:2d}" for v in row) for name, row in zip(names, values)]
    paths["attr"].write_text(newline.join([str(n), " ".join(ATTRIBUTES) + " ", *rows]) + newline)
    paths["partition"].write_text(newline.join(f"{name} {p}" for name, p in zip(names, partition)) + newline)
    for name in names:
        image(rng).save(paths["images"] / name, format="JPEG", quality=90)
    return folder
