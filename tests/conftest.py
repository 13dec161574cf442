"""Shared fixtures: compose configs the way `mtl-bench train` does, without running Hydra's app."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import mtl_bench.config  # noqa: F401  (registers schemas)
from mtl_bench.catalog import conf_root

REPO = Path(__file__).resolve().parent.parent

# Keep test processes from fighting over the 2 cores of CI.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `cuda` are collected everywhere and skipped where no CUDA device is present."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (pytest -m cuda on a GPU machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def compose_cfg() -> Callable[..., DictConfig]:
    def _compose(*overrides: str) -> DictConfig:
        with initialize_config_dir(str(conf_root()), version_base="1.3"):
            return compose("config", overrides=list(overrides))

    return _compose
