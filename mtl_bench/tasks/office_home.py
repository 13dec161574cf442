"""Office-Home (Venkateswara et al. 2017) as LibMTL uses it for MTL (median-research-group/LibMTL at 4336804,
examples/office): tasks Art, Clipart, Product and Real_World, 65-class classification each, each domain its own
images (multi-input: `trainer.step_mode=per_task`), 15588 images in all (Art 2427, Clipart 4365, Product 4439,
Real_World 4357).

Layout: the public archive (OfficeHomeDataset_10072016.zip) unpacked, `tasks.root` the folder holding the domain
folders: `<domain>/<class>/NNNNN.jpg`. The archive names the last domain `Real World`; LibMTL's split files
name it `Real_World`: either folder is read, as task `Real_World`. Nothing is downloaded.
Splits: LibMTL's proportions seeded per class, or LibMTL's split files; transform, labels, loss and metric:
`mtl_bench/tasks/office.py`; folders and class names: `mtl_bench/tasks/office_layouts.py`.
"""

from __future__ import annotations

from typing import Mapping, Optional

from mtl_bench.tasks.base import TaskSet
from mtl_bench.tasks.office import build_office
from mtl_bench.tasks.office_layouts import OFFICE_HOME, OFFICE_HOME_CLASSES

LAYOUT = OFFICE_HOME
CLASSES = OFFICE_HOME_CLASSES


class OfficeHome(TaskSet):
    """Tasks `Art`, `Clipart`, `Product`, `Real_World` (65 classes each: accuracy); inputs (3, 224, 224);
    multi-input."""

    def __init__(
        self,
        root: Optional[str] = None,
        split_files: Optional[str] = None,
        split_seed: int = 0,
        image_size: int = 224,
        check_images: bool = True,
        preload: bool = False,
        reference: Optional[Mapping[str, Mapping[str, float]]] = None,
    ) -> None:
        """
        root: the folder holding Art/, Clipart/, Product/ and Real_World/ (or Real World/); checked here: domain
            and class folders, at least one image per class folder, and (check_images) every image decodes.
        split_files: null: LibMTL's proportions per class (int(0.6 n) train, int(0.2 n) val, the rest test),
            seeded; or a folder with LibMTL's examples/office/data_txt/office-home files
            ({Art,Clipart,Product,Real_World}_{train,val,test}.txt), whose paths are found under root.
        split_seed: seed of the seeded split (each class's permutation also depends on its domain and name).
        image_size: images are resized to image_size x image_size (LibMTL: 224).
        check_images: decode every image once here (threads), so an image that cannot be decoded is a one-line
            error before training; false: a bad image fails when the loader reads it.
        preload: decode and resize every image once here and keep them as uint8 in memory (about 2.3 GB at 224):
            no decoding during training (the transform has no random part); implies the check.
        reference: single-task metrics {task: {metric: value}} for `mtl-bench report -b reference`.
        """
        tasks, splits = build_office(LAYOUT, root, split_files, split_seed, image_size, check_images, preload)
        super().__init__(
            tasks, (3, image_size, image_size), splits["train"], splits["val"], splits["test"], reference=reference
        )
