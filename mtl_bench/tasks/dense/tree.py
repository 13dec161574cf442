"""The preprocessed `.npy` trees of NYUv2 and Cityscapes (MTAN's layout, `{train,val}/<folder>/<i>.npy`):
the constructor's checks of every file's header, the dataset that reads and augments samples, the splits."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from mtl_bench.tasks.base import root_folder
from mtl_bench.tasks.dense.augment import mtan_augment
from mtl_bench.tasks.dense.losses import IGNORE_INDEX


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
