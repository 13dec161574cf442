"""Office-31 and Office-Home as the MTL literature uses them (LibMTL, median-research-group/LibMTL at 4336804,
examples/office): one classification task per domain, each task its own images (multi-input), read from the
datasets' public folders of JPEGs: the reader `office31.py` and `office_home.py` share (their layouts:
`office_layouts.py`).

Data: torchvision `ImageFolder` layout per domain, `<domain dir>/<class>/<image>`; a class's label is its index
among the dataset's class names sorted (ImageFolder's order on a full tree). Files with other extensions than
ImageFolder's image extensions are ignored (as ImageFolder does). A tree may hold only some of the classes:
labels keep their index among all classes and the head keeps its width (31 / 65).

Splits (per domain)
- default, seeded: LibMTL's proportions, per class: of a class's n images (sorted by name, then permuted by
  a generator seeded with `split_seed` and the domain and class names) int(0.6 n) train, int(0.2 n) val, the
  rest test. These are the per-class counts of every one of LibMTL's split files (checked against all 353
  domain-class pairs of data_txt/office-31 and data_txt/office-home), so the split sizes equal LibMTL's.
- `split_files`: a folder holding LibMTL's files `<domain>_{train,val,test}.txt` (examples/office/data_txt/
  office-31 or office-home), one `<path> <label>` per line, the path relative to the dataset's folder
  (`amazon/images/back_pack/frame_0039.jpg`, `Art/Calendar/00010.jpg`). Each path is read as
  (domain, class folder, file name) and found in the domain's folder under `tasks.root`. LibMTL's labels
  number the classes in its own order (Office-31: back_pack 0, paper_notebook 1, ...): they are checked to
  name one class each, and replaced by the sorted-name labels (accuracy does not depend on the numbering).

Transform (LibMTL's create_dataset.py, the same for every split: no augmentation): PIL decodes the file as
RGB, resizes it to 224x224 (both sides, aspect ratio not kept; PIL's bilinear filter, as torchvision's
`Resize` on a PIL image), then scale to [0, 1] and ImageNet mean/std normalization: LibMTL's pixels exactly.
(PIL, not torchvision.io: torchvision 0.29 deprecates its image decoders.)

Tasks: cross-entropy of the logits; metric `accuracy` (fraction of correct arg-max predictions, LibMTL's
AccMetric), higher is better; initial loss log C.
"""

from __future__ import annotations

import functools
import math
import os
import re
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import Dataset

from mtl_bench.optional import torchvision_module
from mtl_bench.tasks.base import Task, root_folder
from mtl_bench.tasks.losses import accuracy_metrics, cross_entropy_loss
from mtl_bench.tasks.office_layouts import LAYOUTS, OfficeLayout

MEAN = (0.485, 0.456, 0.406)  # ImageNet statistics, LibMTL's Normalize
STD = (0.229, 0.224, 0.225)
SPLITS = ("train", "val", "test")
NEEDED_BY = "the Office task sets (tasks=office31, tasks=office_home)"
FRACTIONS = (0.6, 0.2)  # train, val per class, rounded down; test gets the rest (LibMTL's split files)


def _fail(message: str, layout: OfficeLayout) -> ValueError:
    return ValueError(f"root: {message}; expected {layout.describe()}")


def _files_fail(message: str, layout: OfficeLayout) -> ValueError:
    domains = ",".join(layout.domains)
    return ValueError(
        f"split_files: {message}; expected LibMTL's data_txt/{layout.split_folder} folder: "
        f"{{{domains}}}_{{train,val,test}}.txt, lines '<domain>/.../<class>/<file> <label>'"
    )


# --------------------------------------------------------------------------- the tree


def _domain_dir(root: Path, candidates: Sequence[str]) -> Optional[Path]:
    return next((root / c for c in candidates if (root / c).is_dir()), None)


def _hint(root: Path, layout: OfficeLayout) -> str:
    """Why the domain folders may be missing: the tree of the other dataset, or the domains one level down."""
    for other in LAYOUTS:
        if other is not layout and all(_domain_dir(root, c) for c in other.domains.values()):
            return f" (an {other.name} tree? that is tasks={other.option})"
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        if all(_domain_dir(sub, c) for c in layout.domains.values()):
            return f" (the domain folders are in {sub}: tasks.root={sub})"
    return ""


def domain_dirs(root: Path, layout: OfficeLayout) -> dict[str, Path]:
    found = {task: _domain_dir(root, candidates) for task, candidates in layout.domains.items()}
    # a domain's folder names, e.g. "amazon" (of amazon/images, amazon), "Real_World or Real World"
    missing = [
        " or ".join(dict.fromkeys(Path(c).parts[0] for c in layout.domains[task]))
        for task, d in found.items()
        if d is None
    ]
    if missing:
        present = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise _fail(
            f"{root} has no {', '.join(missing)} folder (it has: {', '.join(present) or 'nothing'})"
            f"{_hint(root, layout)}",
            layout,
        )
    return found  # type: ignore[return-value]


def image_extensions() -> tuple[str, ...]:
    """ImageFolder's image extensions (torchvision's list)."""
    return torchvision_module(NEEDED_BY, "torchvision.datasets.folder").IMG_EXTENSIONS


def _is_image(name: str) -> bool:
    return name.lower().endswith(image_extensions())


def scan_domain(directory: Path, layout: OfficeLayout) -> dict[str, list[Path]]:
    """Class name -> its image files (sorted by name); unknown class folders and empty ones are errors."""
    folders = sorted(p.name for p in directory.iterdir() if p.is_dir())
    if not folders:
        raise _fail(f"{directory} holds no class folders", layout)
    known = set(layout.classes)
    unknown = [f for f in folders if f not in known]
    if unknown:
        example = ", ".join(sorted(layout.classes)[:3])
        raise _fail(
            f"{directory} holds folders that are not {layout.name} classes: {', '.join(unknown[:5])}"
            f"{' ...' if len(unknown) > 5 else ''} (its classes: {example}, ...)",
            layout,
        )
    images = {}
    for name in folders:
        files = sorted(
            entry.name for entry in os.scandir(directory / name) if entry.is_file() and _is_image(entry.name)
        )
        if not files:
            raise _fail(f"{directory / name} holds no images ({', '.join(image_extensions()[:3])}, ...)", layout)
        images[name] = [directory / name / f for f in files]
    return images


# --------------------------------------------------------------------------- splits


def seeded_split(images: Mapping[str, Sequence[Path]], task: str, split_seed: int) -> dict[str, list[tuple[Path, str]]]:
    """LibMTL's proportions per class: int(0.6 n) train, int(0.2 n) val, the rest test; each class's files
    permuted by a generator seeded from split_seed, the domain and the class (a class's split does not depend
    on which other classes or domains are present)."""
    out: dict[str, list[tuple[Path, str]]] = {s: [] for s in SPLITS}
    for name in sorted(images):
        files = images[name]
        seed = split_seed * 1_000_003 + zlib.crc32(f"{task}/{name}".encode())
        order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
        n_train, n_val = (int(f * len(files)) for f in FRACTIONS)
        cut = {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}
        for split, picked in cut.items():
            out[split].extend((files[i], name) for i in sorted(picked))
    return out


_LINE = re.compile(r"^(?P<path>.+?)\s+(?P<label>-?\d+)$")


def read_split_files(
    folder: Optional[str],
    layout: OfficeLayout,
    dirs: Mapping[str, Path],
    images: Mapping[str, Mapping[str, Sequence[Path]]],
) -> dict[str, dict[str, list[tuple[Path, str]]]]:
    """{task: {split: [(path, class)]}} from LibMTL's split files, each path found under the domain's folder."""
    path = Path(str(folder)).expanduser()
    if not path.is_dir():
        raise _files_fail(f"{path} {'is not a directory' if path.exists() else 'does not exist'}", layout)
    on_disk = {task: {p for files in by_class.values() for p in files} for task, by_class in images.items()}
    label_of: dict[str, tuple[int, str]] = {}  # class -> (LibMTL's label, where first seen)
    out: dict[str, dict[str, list[tuple[Path, str]]]] = {}
    for task in layout.domains:
        out[task] = {}
        seen: dict[Path, str] = {}  # image -> the line that listed it
        for split in SPLITS:
            txt = path / f"{task}_{split}.txt"
            if not txt.is_file():
                raise _files_fail(f"{path} has no {txt.name}", layout)
            rows = []
            for number, line in enumerate(txt.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                where = f"{txt}:{number}"
                match = _LINE.match(line.strip())
                if match is None:
                    raise _files_fail(f"{where} reads {line.strip()[:80]!r}, not '<path> <label>'", layout)
                parts = Path(match["path"]).parts
                if len(parts) < 3 or parts[0] != task:
                    raise _files_fail(f"{where} names {match['path']}, not an image of the {task} domain", layout)
                name, label = parts[-2], int(match["label"])
                if name not in layout.labels:
                    raise _files_fail(f"{where} names {match['path']}: {name} is not a {layout.name} class", layout)
                first = label_of.setdefault(name, (label, where))
                if first[0] != label:
                    raise _files_fail(f"{where} gives {name} label {label}, {first[1]} gave it {first[0]}", layout)
                image = dirs[task] / name / parts[-1]
                if image not in on_disk[task]:
                    raise _files_fail(
                        f"{where} names {match['path']}, which is not at {image} under tasks.root", layout
                    )
                if image in seen:
                    raise _files_fail(f"{where} names {match['path']}, already listed at {seen[image]}", layout)
                seen[image] = where
                rows.append((image, name))
            if not rows:
                raise _files_fail(f"{txt} lists no images", layout)
            out[task][split] = rows
    labels: dict[int, str] = {}
    for name, (label, where) in label_of.items():
        if labels.setdefault(label, name) != name:
            raise _files_fail(f"{where} gives {name} label {label}, which another file gives {labels[label]}", layout)
    return out


# --------------------------------------------------------------------------- images


def _reason(err: Exception) -> str:
    """PIL's message, one line, without the path (the error names it): 'image file is truncated ...'."""
    if isinstance(err, UnidentifiedImageError):
        return "not an image format PIL reads"
    text = str(err).strip()
    if "truncated" in text.lower():  # "image file is truncated (...)", "Truncated File Read"
        return "the file is truncated"
    return text.splitlines()[0] if text else type(err).__name__


def load_image(path: Path, size: Optional[int]) -> Tensor:
    """(3, size, size) uint8: the file decoded by PIL as RGB (grayscale and CMYK converted), resized by PIL's
    bilinear filter as LibMTL's `transforms.Resize((224, 224))` on a PIL image; size None: as decoded."""
    with Image.open(path) as file:
        image = file.convert("RGB")
    if size is not None:
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).contiguous()


def _try_load(path: Path, size: Optional[int]) -> tuple[Optional[Tensor], Optional[str]]:
    try:
        return load_image(path, size), None
    except Exception as err:  # any decoder failure becomes the one-line error below
        return None, _reason(err)


def decode_all(paths: Sequence[Path], size: int, layout: OfficeLayout, keep: bool) -> Optional[Tensor]:
    """Decode every image (threads; PIL's decoders release the GIL); the first that fails (in order) is a
    one-line error naming it. keep: return them as one (N, 3, size, size) uint8 tensor."""
    out = torch.empty((len(paths), 3, size, size), dtype=torch.uint8) if keep else None
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    pool = ThreadPoolExecutor(max_workers=max(1, min(16, workers)))
    try:
        for i, (image, reason) in enumerate(pool.map(functools.partial(_try_load, size=size if keep else None), paths)):
            if image is None:
                raise _fail(f"{paths[i]} cannot be decoded as an image ({reason})", layout)
            if out is not None:
                out[i] = image
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # a failure does not wait for the rest of the decodes
    return out


def normalize(image: Tensor) -> Tensor:
    """uint8 (3, H, W) -> float32 in [0, 1], ImageNet mean/std normalized (LibMTL's ToTensor + Normalize)."""
    TF = torchvision_module(NEEDED_BY, "torchvision.transforms.v2.functional")
    return TF.normalize(image.float().div_(255), MEAN, STD)


class OfficeDomain(Dataset):
    """One domain's split: items `(image (3, size, size) float32, {task: 0-d int64 label})`."""

    def __init__(
        self,
        task: str,
        paths: Sequence[Path],
        labels: Sequence[int],
        size: int,
        layout: OfficeLayout,
        images: Optional[Tensor] = None,
    ) -> None:
        self.task, self.paths, self.size, self.layout = task, list(paths), size, layout
        self.labels = torch.tensor(list(labels), dtype=torch.int64)
        self.images = images  # preloaded uint8 (N, 3, size, size), or None: decoded when read

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Tensor, dict[str, Tensor]]:
        if self.images is not None:
            image = self.images[i]
        else:
            loaded, reason = _try_load(self.paths[i], self.size)
            if loaded is None:  # changed since the constructor's check, or check_images was off
                raise _fail(f"{self.paths[i]} cannot be decoded as an image ({reason})", self.layout)
            image = loaded
        return normalize(image), {self.task: self.labels[i]}


# --------------------------------------------------------------------------- the task set


def classification_task(name: str, num_classes: int) -> Task:
    return Task(
        name=name,
        out_dim=num_classes,
        loss=cross_entropy_loss,
        metrics=accuracy_metrics,
        higher_is_better={"accuracy": True},
        initial_loss=math.log(num_classes),
    )


def check_options(split_seed: int, image_size: int) -> None:
    if isinstance(split_seed, bool) or not isinstance(split_seed, int) or split_seed < 0:
        raise ValueError(f"split_seed: must be an integer >= 0, got {split_seed!r}")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size: must be a number of pixels >= 1 (LibMTL: 224), got {image_size!r}")


def build_office(
    layout: OfficeLayout,
    root: Optional[str],
    split_files: Optional[str],
    split_seed: int,
    image_size: int,
    check_images: bool,
    preload: bool,
) -> tuple[list[Task], dict[str, dict[str, OfficeDomain]]]:
    """The tasks and {split: {task: OfficeDomain}}; every check runs here, before training."""
    check_options(split_seed, image_size)
    torchvision_module(NEEDED_BY)  # before the tree is read: file types and normalization are torchvision's
    path = root_folder(root, "the domain folders", layout.option, f"expected {layout.describe()}")
    dirs = domain_dirs(path, layout)
    images = {task: scan_domain(d, layout) for task, d in dirs.items()}
    if split_files is None or str(split_files).strip() == "":
        chosen = {task: seeded_split(by_class, task, split_seed) for task, by_class in images.items()}
        for task, by_split in chosen.items():
            for split, rows in by_split.items():
                if not rows:
                    count = sum(len(v) for v in images[task].values())
                    raise _fail(
                        f"the seeded split leaves no {split} images in {dirs[task]} ({count} images in "
                        f"{len(images[task])} classes; per class int(0.6 n) train, int(0.2 n) val, the rest "
                        f"test)",
                        layout,
                    )
    else:
        chosen = read_split_files(split_files, layout, dirs, images)
    labels = layout.labels
    splits: dict[str, dict[str, OfficeDomain]] = {s: {} for s in SPLITS}
    for task in layout.domains:
        for split in SPLITS:
            rows = chosen[task][split]
            paths = [p for p, _ in rows]
            kept = decode_all(paths, image_size, layout, keep=True) if preload else None
            splits[split][task] = OfficeDomain(task, paths, [labels[c] for _, c in rows], image_size, layout, kept)
    if check_images and not preload:
        decode_all(
            [p for split in splits.values() for d in split.values() for p in d.paths], image_size, layout, keep=False
        )
    tasks = [classification_task(task, len(layout.classes)) for task in layout.domains]
    return tasks, splits
