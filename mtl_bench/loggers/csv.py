"""`logger=csv`: plain files in the run directory, readable without TensorBoard (pandas, a spreadsheet, grep).

metrics.csv: one row per value, `step,tag,value` (the tags differ by balancer and split, so one long table rather
than a column per tag); hparams.json: the hyper-parameters and the final metrics' tags; images/<tag>/<step>.png.
A resumed run drops the rows after the step it restarts from, as TensorBoard's purge_step does, then appends.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from mtl_bench.files import write_json
from mtl_bench.loggers.base import Logger, RunInfo

HEADER = ["step", "tag", "value"]


class CSVLogger(Logger):
    def __init__(self, run: RunInfo, filename: str = "metrics.csv") -> None:
        """run: the run's facts (given by the engine); filename: the scalars' file in the run directory (a plain
        name ending in .csv)."""
        if Path(filename).name != filename or not filename.endswith(".csv"):
            raise ValueError(f"filename: must be a plain file name ending in .csv, got {filename!r}")
        self.dir = Path(run.dir)
        self.path = self.dir / filename
        kept = _rows_up_to(self.path, run.resume_step) if run.resume_step is not None else []
        self.file = self.path.open("w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(HEADER)
        self.writer.writerows(kept)

    def log_hparams(self, hparams: Mapping[str, Any], metric_tags: Sequence[str]) -> None:
        write_json(self.dir / "hparams.json", {"hparams": dict(hparams), "metric_tags": list(metric_tags)})

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        self.writer.writerows([step, tag, repr(float(value))] for tag, value in scalars.items())

    def log_image(self, tag: str, image: np.ndarray, step: int) -> None:
        from PIL import Image  # torchvision's dependency; only images need it

        path = self.dir / "images" / Path(*tag.split("/")) / f"{step}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = (np.clip(np.asarray(image, dtype=np.float64), 0.0, 1.0) * 255).round().astype(np.uint8)
        Image.fromarray(pixels.transpose(1, 2, 0)).save(path)

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _rows_up_to(path: Path, step: int) -> list[list[str]]:
    """The rows of an earlier session at or before `step` (a resumed run repeats the steps after it)."""
    if not path.is_file():
        return []
    with path.open(newline="") as file:
        rows = list(csv.reader(file))
    return [row for row in rows[1:] if len(row) == 3 and int(row[0]) <= step]
