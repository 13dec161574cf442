"""The Python API of `mtl-bench train`: compose a config from the same overrides and train it on the same path.

    from mtl_bench.api import compose_config, run
    result = run(["balancer=gradnorm", "trainer=smoke"], "outputs/mine")

`run` composes as the CLI does (Hydra's compose API on the shipped conf/) and calls `engine.recipe.train`, which
finalises the config (`engine.compose.finalise_config`) exactly as it does under `mtl-bench train`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

import mtl_bench.config  # noqa: F401  (registers the structured-config schemas before Hydra composes)
from mtl_bench.catalog import conf_root

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import TrainResult


def compose_with_choices(overrides: Sequence[str] = ()) -> tuple[DictConfig, dict[str, str]]:
    """The composed config (not yet finalised: `train()` does that) and the config-group options chosen."""
    with initialize_config_dir(str(conf_root()), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    choices = {
        str(group): str(option)
        for group, option in cfg.hydra.runtime.choices.items()
        if not str(group).startswith("hydra") and option is not None
    }
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The config `mtl-bench train <overrides>` composes (before `train()` finalises it)."""
    return compose_with_choices(overrides)[0]


def run(overrides: Sequence[str], run_dir: str | Path) -> "TrainResult":
    """Train `mtl-bench train <overrides>` with its outputs in `run_dir`; refused input raises ConfigError."""
    from mtl_bench.engine.recipe import train  # torch: imported when a run starts

    cfg, choices = compose_with_choices(overrides)
    return train(cfg, Path(run_dir), overrides=list(overrides), choices=choices)
