"""Tiny Office-31 and Office-Home trees in the real layout (real JPEG files, the real domain and class folder
names, a few classes and images), LibMTL-format split files for them, and a tiny classifier for training."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from PIL import Image
from torch import nn

from mtl_bench.models import MultiTaskModel

OFFICE31_DOMAINS = ("amazon", "dslr", "webcam")
OFFICE_HOME_DOMAINS = ("Art", "Clipart", "Product", "Real_World")


def jpeg(path: Path, generator: torch.Generator, height: int = 12, width: int = 16, gray: bool = False) -> None:
    """A real JPEG (baseline, by PIL's libjpeg): a colour plus noise, RGB or grayscale (any size: the task set
    resizes to 224x224)."""
    channels = 1 if gray else 3
    base = torch.rand(1, 1, channels, generator=generator) * 200
    noise = torch.rand(height, width, channels, generator=generator) * 55
    pixels = (base + noise).to(torch.uint8).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels[..., 0] if gray else pixels, mode="L" if gray else "RGB").save(path, "JPEG", quality=90)


def write_tree(
    root: Path, domains: dict[str, str], classes: Sequence[str], per_class: int, name: str, seed: int
) -> Path:
    """domains: domain -> its folder of class folders relative to root; name: file name pattern ({i} from 1)."""
    generator = torch.Generator().manual_seed(seed)
    for k, folder in enumerate(domains.values()):
        for c, cls in enumerate(classes):
            for i in range(1, per_class + 1):
                size = (12 + (i + c + k) % 3 * 4, 16 + i % 2 * 8)  # sizes differ from image to image
                jpeg(root / folder / cls / name.format(i=i), generator, *size, gray=(i == 2))
    return root


def write_office31(
    root: Path,
    per_class: int = 5,
    classes: Sequence[str] = ("back_pack", "bike", "mug"),
    domains: Sequence[str] = OFFICE31_DOMAINS,
    seed: int = 0,
) -> Path:
    """`<root>/<domain>/images/<class>/frame_NNNN.jpg`, as domain_adaptation_images.tar.gz unpacks."""
    return write_tree(root, {d: f"{d}/images" for d in domains}, classes, per_class, "frame_{i:04d}.jpg", seed)


def write_office_home(
    root: Path,
    per_class: int = 5,
    classes: Sequence[str] = ("Alarm_Clock", "TV", "Table"),
    domains: Sequence[str] = OFFICE_HOME_DOMAINS,
    real_world: str = "Real World",
    seed: int = 0,
) -> Path:
    """`<root>/<domain>/<class>/NNNNN.jpg`, as OfficeHomeDataset_10072016.zip unpacks (`Real World` with a space;
    real_world="Real_World" for LibMTL's renamed copy)."""
    folders = {d: (real_world if d == "Real_World" else d) for d in domains}
    return write_tree(root, folders, classes, per_class, "{i:05d}.jpg", seed)


def write_split_files(folder: Path, rows: dict[str, dict[str, list[tuple[str, int]]]]) -> Path:
    """LibMTL's data_txt format: `<domain>_<split>.txt`, one `<path> <label>` per line, each line ending in \\n."""
    folder.mkdir(parents=True, exist_ok=True)
    for domain, splits in rows.items():
        for split, lines in splits.items():
            (folder / f"{domain}_{split}.txt").write_text("".join(f"{p} {label}\n" for p, label in lines))
    return folder


class TinyClassifier(MultiTaskModel):
    """Average-pooled image -> Linear trunk -> one Linear head per task (a few hundred parameters)."""

    def __init__(self, input_shape: Sequence[int], heads: dict[str, int], width: int = 8, pool: int = 4) -> None:
        linear = nn.Linear(input_shape[0] * pool * pool, width)
        trunk = nn.Sequential(nn.AdaptiveAvgPool2d(pool), nn.Flatten(), linear, nn.ReLU())
        super().__init__(trunk, {task: nn.Linear(width, out) for task, out in heads.items()}, last_shared_layer=linear)
