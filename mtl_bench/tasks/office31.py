"""Office-31 (Saenko et al. 2010) as LibMTL uses it for MTL (median-research-group/LibMTL at 4336804,
examples/office): tasks amazon, dslr and webcam, 31-class classification each, each domain its own images
(multi-input: `trainer.step_mode=per_task`), 4110 images in all (amazon 2817, dslr 498, webcam 795).

Layout: the public archive (domain_adaptation_images.tar.gz) unpacked, `tasks.root` the folder holding
`amazon/`, `dslr/` and `webcam/`: `<domain>/images/<class>/frame_NNNN.jpg` (a copy without the images/ level,
`<domain>/<class>/...`, is read too). Nothing is downloaded.
Splits: LibMTL's proportions seeded per class, or LibMTL's split files; transform, labels, loss and metric:
`mtl_bench/tasks/office.py`; folders and class names: `mtl_bench/tasks/office_layouts.py`.
"""

from __future__ import annotations

from typing import Mapping, Optional

from mtl_bench.tasks.base import TaskSet
from mtl_bench.tasks.office import build_office
from mtl_bench.tasks.office_layouts import OFFICE_31, OFFICE_31_CLASSES

LAYOUT = OFFICE_31
CLASSES = OFFICE_31_CLASSES


class Office31(TaskSet):
    """Tasks `amazon`, `dslr`, `webcam` (31 classes each: accuracy); inputs (3, 224, 224); multi-input."""

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
        root: the folder holding amazon/, dslr/ and webcam/; checked here: domain and class folders, at least one
            image per class folder, and (check_images) every image decodes.
        split_files: null: LibMTL's proportions per class (int(0.6 n) train, int(0.2 n) val, the rest test),
            seeded; or a folder with LibMTL's examples/office/data_txt/office-31 files
            ({amazon,dslr,webcam}_{train,val,test}.txt), whose paths are found under root.
        split_seed: seed of the seeded split (each class's permutation also depends on its domain and name).
        image_size: images are resized to image_size x image_size (LibMTL: 224).
        check_images: decode every image once here (threads), so an image that cannot be decoded is a one-line
            error before training; false: a bad image fails when the loader reads it.
        preload: decode and resize every image once here and keep them as uint8 in memory (about 0.6 GB at 224):
            no decoding during training (the transform has no random part); implies the check.
        reference: single-task metrics {task: {metric: value}} for `mtl-bench report -b reference`.
        """
        tasks, splits = build_office(LAYOUT, root, split_files, split_seed, image_size, check_images, preload)
        super().__init__(
            tasks, (3, image_size, image_size), splits["train"], splits["val"], splits["test"], reference=reference
        )
