"""`mtl-bench prepare`: build a task set once from the same overrides as `train`, so that its cached data (tasks=qm9's
graphs) exist before a sweep's jobs start."""

from __future__ import annotations

import logging
import sys
import time
from typing import Mapping, Sized

from mtl_bench.errors import ConfigError


def prepare(overrides: list[str]) -> str:
    """Compose the config with `overrides`, build its task set; returns a one-line summary (bad input: ConfigError)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    import mtl_bench.config  # noqa: F401  (registers the schemas the defaults list names)
    from mtl_bench.catalog import conf_root
    from mtl_bench.engine.builders import build
    from mtl_bench.hydra_errors import describe
    from mtl_bench.tasks.base import TaskSet

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")  # the cache's progress lines
    try:
        with initialize_config_dir(str(conf_root()), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        from mtl_bench.engine.compose import part_keys

        raise ConfigError(describe(err, part_keys(overrides))) from None
    start = time.perf_counter()
    taskset = build("tasks", cfg.tasks, TaskSet)
    sizes = ", ".join(f"{name} {_size(getattr(taskset, name))}" for name in ("train", "val", "test"))
    return f"tasks ready in {time.perf_counter() - start:.1f} s: {sizes}"


def _size(split: object) -> str:
    """Samples of a split; a multi-input split's per task."""
    if isinstance(split, Mapping):
        return "/".join(str(len(s)) for s in split.values())
    return str(len(split)) if isinstance(split, Sized) else "?"
