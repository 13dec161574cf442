"""What a run tells its loggers: one interface for scalars, images and hyper-parameters (`logger=<option>`).

A logger is built from config by `_target_` like every part (conf/logger/); the engine supplies `run` (a `RunInfo`:
the run directory, the step a resumed run restarts from, the task set's metrics) to a constructor that takes it.
Several loggers at once are several nodes under `logger:` (`logger=[tensorboard,csv]`); the engine calls each in
turn. Only rank 0 of a DDP run builds loggers. A user's logger subclasses `Logger` and overrides what it records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class RunInfo:
    """What the engine knows of the run when it builds its loggers.

    dir: the run directory; resume_step: the step a resumed run restarts from (records after it are stale), None
    for a fresh run; metric_names: each task's metrics, its loss first; task_set: the `tasks=` option, if any."""

    dir: Path
    resume_step: Optional[int] = None
    metric_names: Mapping[str, Sequence[str]] = field(default_factory=dict)
    task_set: Optional[str] = None


class Logger:
    """The interface; every method does nothing here, so a logger overrides only what it records."""

    def log_hparams(self, hparams: Mapping[str, Any], metric_tags: Sequence[str]) -> None:
        """A fresh run's hyper-parameters ({"balancer": "gradnorm", "optim.lr": 0.001, ...}) and the tags of the
        final metrics they are compared on (logged as scalars at the end of the run)."""

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        """Values by tag (mtl_bench/tags.py names them) at an optimizer step."""

    def log_image(self, tag: str, image: np.ndarray, step: int) -> None:
        """A (3, H, W) float image with values in 0..1."""

    def flush(self) -> None:
        """Make what was logged so far readable (after an evaluation)."""

    def close(self) -> None:
        """Release files; called once, also when the run fails."""


def missing_methods(cls: type) -> list[str]:
    """The interface's methods a logger class lacks: none for a subclass of `Logger`; a class of one's own that does
    not subclass it must define them all (the engine calls each)."""
    if issubclass(cls, Logger):
        return []
    return [
        name
        for name, value in vars(Logger).items()
        if callable(value) and not name.startswith("_") and not callable(getattr(cls, name, None))
    ]


class Loggers(Logger):
    """Several loggers as one: each call goes to each in turn; close closes all even when one fails."""

    def __init__(self, loggers: Sequence[Logger]) -> None:
        self.loggers = list(loggers)

    def log_hparams(self, hparams: Mapping[str, Any], metric_tags: Sequence[str]) -> None:
        for logger in self.loggers:
            logger.log_hparams(hparams, metric_tags)

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log_scalars(scalars, step)

    def log_image(self, tag: str, image: np.ndarray, step: int) -> None:
        for logger in self.loggers:
            logger.log_image(tag, image, step)

    def flush(self) -> None:
        for logger in self.loggers:
            logger.flush()

    def close(self) -> None:
        errors = []
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as err:  # the others still close; the first error is raised after
                errors.append(err)
        if errors:
            raise errors[0]
