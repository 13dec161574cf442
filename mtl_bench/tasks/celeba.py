"""CelebA (Liu et al. ICCV 2015) as FAMO uses it (Liu et al. NeurIPS 2023, github.com/Cranial-XIX/FAMO at 0a6ad06,
experiments/celeba/data.py and trainer.py): 40 binary face attributes, one task each, from the aligned 178x218
JPEGs resized to 64x64. Nash-MTL (AvivNavon/nash-mtl) has no CelebA experiment. Nothing is downloaded:
`tasks.root` is a local copy of the public release.

Layout read (torchvision's `torchvision.datasets.CelebA` layout, without its md5 checks and without the
identity/bbox/landmark files it also wants):
    <root>/img_align_celeba/000001.jpg ... 202599.jpg   (178 wide x 218 high RGB JPEGs)
    <root>/list_attr_celeba.txt       line 1: the image count; line 2: the 40 attribute names;
                                      then `<name>.jpg` and 40 values of -1 or 1 per line
    <root>/list_eval_partition.txt    `<name>.jpg <0|1|2>` per line: 0 train, 1 val, 2 test
`tasks.root` is that folder, or its parent holding celeba/ (torchvision's `root`, which reads root/celeba/...).
The original release's folders (Img/img_align_celeba/, Anno/list_attr_celeba.txt, Eval/list_eval_partition.txt,
the layout FAMO's data.py reads) are accepted too. Splits are the release's: 162,770 train, 19,867 val, 19,962 test.

Checked when the task set is built: the layout, both text files in full (count line, the 40 names, one row of 40
values of -1/1 per image, the same images in both files, partitions 0/1/2, no empty split), that every listed
JPEG exists, and the first image of each split (readable, 178x218). Every image is checked again when loaded.

Inputs: FAMO's exactly (the same numbers): `PIL.Image.open(...).convert('RGB')` (grayscale converted),
resized by torchvision.transforms.v2 on the PIL image (PIL's bilinear with antialiasing, as FAMO's
`transforms.Resize((64, 64))`), scaled to [0, 1] float32 as `ToTensor()`. No normalisation, no augmentation (FAMO
has none). PIL rather than torchvision.io: torchvision 0.29 deprecates its decoders, and its tensor resize differs
from PIL's by up to one 1/255 step. Pillow is a dependency of torchvision.

Tasks: one per attribute, named as in the file's header (`5_o_Clock_Shadow`, ..., `Young`), target (1,) float32
in {0, 1} (the file's -1 -> 0). The head gives one logit. Loss: binary cross-entropy of the logit, as FAMO's
`BCELoss` on the model's sigmoid output (computed from the logit: equal where the sigmoid does not saturate;
FAMO's clamps log(0) to -100 where it does). A prediction is positive where sigmoid(logit) > 0.5 (FAMO's
`y_pred.gt(0.5)`, on the same float32 sigmoid).

Metrics per attribute, over the split (the `metrics` option picks which are reported):
  accuracy  fraction of images whose attribute is predicted right (higher is better);
  error     1 - accuracy (lower is better): the metric Δm uses;
  f1        FAMO's metric (its `CelebaMetrics`): precision = TP / (TP + FP + 1e-8), recall = TP / (TP + FN + 1e-8),
            f1 = 2 precision recall / (precision + recall + 1e-8), TP/FP/FN counted over the whole split.
Δm counts every reported metric that the baseline names: against a group of runs that report both accuracy
and error, each attribute counts twice; for Δm on error alone use `metrics: [error]` or a reference naming
error only.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import Dataset

from mtl_bench.optional import torchvision_module
from mtl_bench.tasks.base import Task, TaskSet, root_folder

ATTRIBUTES = (
    "5_o_Clock_Shadow",
    "Arched_Eyebrows",
    "Attractive",
    "Bags_Under_Eyes",
    "Bald",
    "Bangs",
    "Big_Lips",
    "Big_Nose",
    "Black_Hair",
    "Blond_Hair",
    "Blurry",
    "Brown_Hair",
    "Bushy_Eyebrows",
    "Chubby",
    "Double_Chin",
    "Eyeglasses",
    "Goatee",
    "Gray_Hair",
    "Heavy_Makeup",
    "High_Cheekbones",
    "Male",
    "Mouth_Slightly_Open",
    "Mustache",
    "Narrow_Eyes",
    "No_Beard",
    "Oval_Face",
    "Pale_Skin",
    "Pointy_Nose",
    "Receding_Hairline",
    "Rosy_Cheeks",
    "Sideburns",
    "Smiling",
    "Straight_Hair",
    "Wavy_Hair",
    "Wearing_Earrings",
    "Wearing_Hat",
    "Wearing_Lipstick",
    "Wearing_Necklace",
    "Wearing_Necktie",
    "Young",
)  # the header of list_attr_celeba.txt, in its order
HEIGHT, WIDTH = 218, 178  # img_align_celeba
SPLITS = {"train": 0, "val": 1, "test": 2}  # list_eval_partition.txt
METRICS = {"accuracy": True, "error": False, "f1": True}  # name -> higher is better
IMAGES, ATTR, PARTITION = "img_align_celeba", "list_attr_celeba.txt", "list_eval_partition.txt"
ORIGINAL = {
    IMAGES: "Img/img_align_celeba",
    ATTR: "Anno/list_attr_celeba.txt",
    PARTITION: "Eval/list_eval_partition.txt",
}  # the original release's folders
EPS = 1e-8  # FAMO's CelebaMetrics

EXPECTED = (
    f"expected torchvision's CelebA layout: {IMAGES}/ (178x218 JPEGs), {ATTR} and {PARTITION} in tasks.root "
    f"or in tasks.root/celeba (or the original release's Img/, Anno/, Eval/ folders)"
)

NEEDED_BY = "CelebA (tasks=celeba)"


def _fail(message: str) -> ValueError:
    return ValueError(f"root: {message}; {EXPECTED}")


# --------------------------------------------------------------------------- loss and metrics


def _check_shapes(pred: Tensor, target: Tensor) -> None:
    if pred.dim() != 2 or pred.shape[1] != 1 or pred.shape != target.shape:
        raise ValueError(
            f"prediction shape {tuple(pred.shape)} and target shape {tuple(target.shape)}: "
            f"expected (N, 1) logits and (N, 1) targets in {{0, 1}}"
        )


def attribute_loss(pred: Tensor, target: Tensor) -> Tensor:
    """Mean binary cross-entropy of (N, 1) logits against (N, 1) targets in {0, 1}."""
    _check_shapes(pred, target)
    return F.binary_cross_entropy_with_logits(pred.float(), target.float())


@torch.no_grad()
def attribute_metrics(pred: Tensor, target: Tensor) -> dict[str, Tensor]:
    """Counts over the batch: correct predictions and FAMO's TP, FP, FN (positive: sigmoid(logit) > 0.5)."""
    _check_shapes(pred, target)
    positive = torch.sigmoid(pred.float()).gt(0.5).float()
    target = target.float()
    return {
        "correct": (positive == target).sum().float(),
        "tp": (positive * target).sum(),
        "fp": (positive * (1 - target)).sum(),
        "fn": ((1 - positive) * target).sum(),
    }


def attribute_summary(sums: dict[str, Tensor], n: int, metrics: Sequence[str]) -> dict[str, Tensor]:
    """The chosen metrics from the split's counts (f1 with FAMO's epsilons, in float64)."""
    accuracy = sums["correct"].double() / n
    tp, fp, fn = (sums[k].double() for k in ("tp", "fp", "fn"))
    precision, recall = tp / (tp + fp + EPS), tp / (tp + fn + EPS)
    values = {"accuracy": accuracy, "error": 1 - accuracy, "f1": 2 * precision * recall / (precision + recall + EPS)}
    return {name: values[name].float() for name in metrics}


def attribute_task(name: str, metrics: Sequence[str]) -> Task:
    return Task(
        name=name,
        out_dim=1,
        loss=attribute_loss,
        metrics=attribute_metrics,
        higher_is_better={m: METRICS[m] for m in metrics},
        initial_loss=math.log(2),
        summarize=functools.partial(attribute_summary, metrics=tuple(metrics)),
    )


# --------------------------------------------------------------------------- the tree


def find_files(root: Optional[str]) -> dict[str, Path]:
    """{IMAGES: folder, ATTR: file, PARTITION: file} in the first layout that holds them, or a one-line error."""
    path = root_folder(root, "img_align_celeba/ (or its parent with celeba/)", "celeba", EXPECTED)
    folder = path / "celeba" if (path / "celeba").is_dir() and not (path / ATTR).exists() else path
    layouts = [{k: folder / k for k in ORIGINAL}, {k: folder / v for k, v in ORIGINAL.items()}]
    for files in layouts:
        if all(p.exists() for p in files.values()):
            for key, p in files.items():
                if key == IMAGES and not p.is_dir():
                    raise _fail(f"{p} is not a directory")
                if key != IMAGES and not p.is_file():
                    raise _fail(f"{p} is not a file")
            return files
    original = any((folder / part).is_dir() for part in ("Img", "Anno", "Eval"))
    files = layouts[1] if original else layouts[0]
    missing = [
        str(p.relative_to(folder)) + ("/" if key == IMAGES else "") for key, p in files.items() if not p.exists()
    ]
    present = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    hint = ""
    if {"train/", "val/"} <= set(present):
        hint = " (an NYUv2 or Cityscapes tree? that is tasks=nyuv2 or tasks=cityscapes)"
    shown = ", ".join(present[:8]) + (", ..." if len(present) > 8 else "")
    raise _fail(f"{folder} has no {', '.join(missing)} (it has: {shown or 'nothing'}){hint}")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except UnicodeDecodeError as err:
        raise _fail(f"{path} is not a text file (byte {err.start} is not ASCII)") from None


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in _text(path).splitlines()]


def read_attributes(path: Path) -> tuple[list[str], Tensor]:
    """Image names and (N, 40) int8 values in {-1, 1}, from list_attr_celeba.txt, every line checked."""
    lines = _text(path).splitlines()
    head = [line.split() for line in lines[:2]]
    if len(head) < 2 or len(head[0]) != 1 or not head[0][0].isdigit():
        first = " ".join(head[0]) if head else "nothing"
        raise _fail(f"{path} line 1 is {first[:40]!r}, not the image count")
    if tuple(head[1]) != ATTRIBUTES:
        raise _fail(
            f"{path} line 2 names {len(head[1])} attributes ({' '.join(head[1][:3])} ...), not CelebA's 40 "
            f"({ATTRIBUTES[0]} ... {ATTRIBUTES[-1]})"
        )
    pairs = [line.split(None, 1) for line in lines[2:] if line.strip()]
    count = int(head[0][0])
    if len(pairs) != count:
        raise _fail(f"{path} line 1 says {count} images but {len(pairs)} rows follow")
    if not pairs:
        raise _fail(f"{path} lists no images")
    names = [pair[0] for pair in pairs]
    # The values of all rows parsed at once (202,599 rows: a second, not ten); on any doubt the rows are read one
    # by one to name the bad one.
    values = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy warns (not raises) where a token is not an integer
            flat = np.fromstring(" ".join(p[1] if len(p) > 1 else "" for p in pairs), dtype=np.int64, sep=" ")
        if flat.size == count * len(ATTRIBUTES) and bool(np.isin(flat, (-1, 1)).all()):
            values = flat.reshape(count, len(ATTRIBUTES))
    except (ValueError, DeprecationWarning):
        pass
    if values is None:
        for i, pair in enumerate(pairs):
            row = pair[1].split() if len(pair) > 1 else []
            if len(row) != len(ATTRIBUTES) or any(v not in ("1", "-1") for v in row):
                raise _fail(
                    f"{path} row {i + 1} ({pair[0]}) has {len(row)} values "
                    f"{' '.join(sorted(set(row))[:4])}, not 40 values of -1 or 1"
                )
        values = np.array([[int(v) for v in pair[1].split()] for pair in pairs])
    if len(set(names)) != len(names):
        raise _fail(f"{path} lists an image twice")
    return names, torch.from_numpy(values.astype(np.int8))


def read_partition(path: Path, names: Sequence[str], attr_path: Path) -> Tensor:
    """(N,) int64 partition (0 train, 1 val, 2 test) of `names`, from list_eval_partition.txt."""
    partition: dict[str, int] = {}
    for i, row in enumerate(r for r in _lines(path) if r):
        if len(row) != 2 or row[1] not in ("0", "1", "2"):
            raise _fail(f"{path} row {i + 1} is {' '.join(row)[:60]!r}, not '<name>.jpg <0|1|2>'")
        partition[row[0]] = int(row[1])
    unlisted = [n for n in names if n not in partition]
    if unlisted or len(partition) != len(names):
        extra = sorted(set(partition) - set(names))
        odd = f"{unlisted[0]} is in {attr_path.name} only" if unlisted else f"{extra[0]} is in {path.name} only"
        raise _fail(f"{path} lists {len(partition)} images, {attr_path} {len(names)} ({odd})")
    return torch.tensor([partition[n] for n in names], dtype=torch.int64)


def load_image(path: Path, size: Sequence[int]) -> Tensor:
    """(3, *size) float32 in [0, 1], as FAMO's `Image.open(...).convert('RGB')`, `Resize(size)`, `ToTensor()`:
    checked to be 178x218, resized by PIL (bilinear, antialiased), scaled by 1/255."""
    try:
        with Image.open(path) as file:
            if file.size != (WIDTH, HEIGHT):
                raise _fail(f"{path} is {file.size[0]}x{file.size[1]} ({file.mode}), not {WIDTH}x{HEIGHT}")
            image = file.convert("RGB")
    except (OSError, SyntaxError) as err:  # PIL: UnidentifiedImageError, truncated file; SyntaxError: broken header
        raise _fail(
            f"{path} is not a readable image ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
        ) from None
    TF = torchvision_module(NEEDED_BY, "torchvision.transforms.v2.functional")
    bilinear = torchvision_module(NEEDED_BY, "torchvision.transforms").InterpolationMode.BILINEAR
    image = TF.resize(image, list(size), interpolation=bilinear, antialias=True)
    return TF.pil_to_tensor(image).float().div_(255)


class CelebAImages(Dataset):
    """Items `(image (3, H, W) float32 in [0, 1], {attribute: (1,) float32 in {0, 1}})` of the listed images."""

    def __init__(
        self,
        image_dir: Path,
        names: Sequence[str],
        labels: Tensor,
        attributes: Sequence[str],
        image_size: Sequence[int],
    ) -> None:
        self.image_dir, self.names, self.attributes = Path(image_dir), list(names), list(attributes)
        self.labels = labels.float()  # (N, len(attributes)) in {0, 1}
        self.image_size = tuple(image_size)

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> tuple[Tensor, dict[str, Tensor]]:
        image = load_image(self.image_dir / self.names[i], self.image_size)
        row = self.labels[i]
        return image, {name: row[j : j + 1].clone() for j, name in enumerate(self.attributes)}


def _check_options(
    image_size: Sequence[int], attributes: Optional[Sequence[str]], metrics: Sequence[str]
) -> tuple[tuple[int, int], list[str], list[str]]:
    if (
        isinstance(image_size, (str, bytes))
        or len(image_size) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in image_size)
    ):
        raise ValueError(f"image_size: must be [height, width], two integers > 0, got {image_size!r}")
    if attributes is None:
        chosen = list(ATTRIBUTES)
    else:
        if isinstance(attributes, str):
            attributes = [attributes]
        unknown = [a for a in attributes if a not in ATTRIBUTES]
        if unknown or not attributes or len(set(attributes)) != len(attributes):
            what = f"unknown {', '.join(map(str, unknown))}" if unknown else "empty or repeated"
            raise ValueError(f"attributes: {what}; null (all 40) or names of {', '.join(ATTRIBUTES)}")
        chosen = list(attributes)
    if isinstance(metrics, str):
        metrics = [metrics]
    if not metrics or any(m not in METRICS for m in metrics) or len(set(metrics)) != len(metrics):
        raise ValueError(
            f"metrics: must be a non-empty list of distinct names among {', '.join(METRICS)}, got {list(metrics)!r}"
        )
    return (int(image_size[0]), int(image_size[1])), chosen, list(metrics)


class CelebA(TaskSet):
    """One task per CelebA attribute (all 40, or `attributes`), each a (1,) logit with `metrics` (accuracy, error,
    f1); inputs (3, 64, 64) by default. Layout, transforms, loss and metrics: the module's docstring."""

    def __init__(
        self,
        root: Optional[str] = None,
        image_size: Sequence[int] = (64, 64),
        attributes: Optional[Sequence[str]] = None,
        metrics: Sequence[str] = ("accuracy", "error"),
        reference: Optional[Mapping[str, Mapping[str, float]]] = None,
    ) -> None:
        """
        root: the folder holding img_align_celeba/, list_attr_celeba.txt and list_eval_partition.txt, or its parent
            holding celeba/ (torchvision's root), or the original release's folder (Img/, Anno/, Eval/); checked
            here: both text files in full, every listed image's presence, the first image of each split.
        image_size: [height, width] the 178x218 images are resized to (FAMO: 64x64).
        attributes: null for all 40 attributes (FAMO), or a list of attribute names (one task each).
        metrics: which of accuracy, error (1 - accuracy) and f1 (FAMO's) each attribute reports.
        reference: single-task metrics {attribute: {metric: value}} for `mtl-bench report -b reference`.
        """
        torchvision_module(NEEDED_BY)  # before the tree is read: the images are resized by torchvision
        size, chosen, metrics = _check_options(image_size, attributes, metrics)
        files = find_files(root)
        names, values = read_attributes(files[ATTR])
        partition = read_partition(files[PARTITION], names, files[ATTR])
        present = set(os.listdir(files[IMAGES]))
        absent = [n for n in names if n not in present]
        if absent:
            raise _fail(
                f"{files[IMAGES]} lacks {len(absent)} of the {len(names)} images listed in {files[ATTR]} "
                f"(e.g. {absent[0]})"
            )
        columns = [ATTRIBUTES.index(a) for a in chosen]
        labels = (values[:, columns] > 0).to(torch.int8)
        splits = {}
        for split, code in SPLITS.items():
            index = torch.nonzero(partition == code).flatten()
            if len(index) == 0:
                raise _fail(f"{files[PARTITION]} puts no image in the {split} split (partition {code})")
            split_names = [names[i] for i in index.tolist()]
            load_image(files[IMAGES] / split_names[0], size)  # the first image of each split, fully
            splits[split] = CelebAImages(files[IMAGES], split_names, labels[index], chosen, size)
        tasks = [attribute_task(name, metrics) for name in chosen]
        super().__init__(tasks, (3, *size), splits["train"], splits["val"], splits["test"], reference=reference)
