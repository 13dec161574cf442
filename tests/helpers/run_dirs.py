"""Run directories as `mtl-bench train OVERRIDES` leaves them, without training: the composed config saved."""

from __future__ import annotations

from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

import mtl_bench.config  # noqa: F401  (registers the schemas)
from mtl_bench.catalog import conf_root


def saved_run(root: Path, name: str, overrides: list[str]) -> tuple[Path, DictConfig, dict[str, str]]:
    """`root/name` with `.hydra/config.yaml` and `.hydra/overrides.yaml`; returns it, the config and the choices."""
    with initialize_config_dir(str(conf_root()), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if v is not None and not k.startswith("hydra/")}
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    return run, cfg, choices
