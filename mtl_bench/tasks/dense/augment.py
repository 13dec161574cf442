"""MTAN's training augmentation of dense samples (github.com/lorenmt/mtan im2im_pred/create_dataset.py at
c36c30b: RandomScaleCrop and the horizontal flip), with its random draws given or from a seeded generator."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.nn import functional as F

SCALES = (1.0, 1.2, 1.5)  # MTAN's RandomScaleCrop


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
