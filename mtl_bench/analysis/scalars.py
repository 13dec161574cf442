"""Reading a run's logged scalars back, whichever shipped logger wrote them: one interface (`ScalarReader`), one
reader per logger (TensorBoard's event files, the CSV logger's `step,tag,value` file), and `read_scalars`, which asks
them in turn. The report's plots and the did-it-learn check read a `logger=csv` run as they read a TensorBoard run.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Optional, Protocol

Series = dict[str, list[tuple[int, float]]]  # tag -> [(step, value), ...] in step order as logged
CSV_HEADER = ["step", "tag", "value"]  # loggers/csv.py's header


class ScalarReader(Protocol):
    def read(self, run_dir: Path, prefix: str) -> Optional[Series]:
        """The scalars whose tag starts with `prefix`; None when this reader's logger left no file in `run_dir`."""
        ...


class TensorBoardReader:
    """`logger=tensorboard`: the event files in the run directory (a resumed run's rewrite of the steps after its
    checkpoint wins, as in TensorBoard)."""

    def read(self, run_dir: Path, prefix: str) -> Optional[Series]:
        if not any(run_dir.glob("events.out.tfevents.*")):
            return None
        import logging

        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        # noise here: "No path found after <file>", and "Detected out of order event.step" for a resumed run (whose
        # later session rewrote the steps after its checkpoint: TensorBoard keeps the rewrite, as the report wants)
        logging.getLogger("tensorboard").setLevel(logging.ERROR)
        events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        events.Reload()
        return {
            tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]
            if tag.startswith(prefix)
        }


class CSVReader:
    """`logger=csv`: the `step,tag,value` file (metrics.csv, or any other name given as logger.csv.filename: a .csv
    in the run directory that starts with that header). The logger itself drops a resumed run's repeated rows."""

    def read(self, run_dir: Path, prefix: str) -> Optional[Series]:
        path = self.find(run_dir)
        if path is None:
            return None
        series: Series = {}
        with path.open(newline="") as file:
            rows = csv.reader(file)
            next(rows, None)
            for row in rows:
                if len(row) == 3 and row[1].startswith(prefix):
                    series.setdefault(row[1], []).append((int(row[0]), float(row[2])))
        return series

    @staticmethod
    def find(run_dir: Path) -> Optional[Path]:
        candidates = [run_dir / "metrics.csv", *sorted(p for p in run_dir.glob("*.csv") if p.name != "metrics.csv")]
        for path in candidates:
            try:
                with path.open(newline="") as file:
                    if next(csv.reader(file), None) == CSV_HEADER:
                        return path
            except OSError:
                continue
        return None


READERS: tuple[ScalarReader, ...] = (TensorBoardReader(), CSVReader())  # a run with both loggers reads TensorBoard


def read_scalars(run_dir: Path, prefix: str) -> Series:
    """The run's scalars whose tag starts with `prefix`, from the first logger that left files there ({} if none)."""
    for reader in READERS:
        found = reader.read(run_dir, prefix)
        if found is not None:
            return found
    return {}
