"""The Hydra application behind `mtl-bench train`.

Import cost matters: `mtl-bench train --help` and `--cfg job` import this module, so torch is
imported only inside the task function.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from mtl_bench.catalog import conf_root, format_config_options
import mtl_bench.config  # noqa: F401  (registers the structured-config schemas before Hydra composes)
from mtl_bench.errors import ConfigError

# The help template lists our groups through this resolver, so the schema/* groups stay out of it.
OmegaConf.register_new_resolver("mtl_bench_config_groups", format_config_options, replace=True)


@hydra.main(version_base="1.3", config_path=str(conf_root()), config_name="config")
def hydra_main(cfg: DictConfig) -> float | None:
    from mtl_bench.engine.run import run_experiment

    try:
        return run_experiment(cfg)
    except ConfigError as err:
        # A user error: one line, no traceback, non-zero exit.
        print(f"mtl-bench: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    hydra_main()
