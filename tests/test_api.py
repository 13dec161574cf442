"""One entry path: `mtl-bench train` and the Python API (mtl_bench.api) compose, finalise and train the same config."""

from __future__ import annotations

import json

import torch
from omegaconf import OmegaConf

from mtl_bench.api import compose_config, run
from tests.helpers.cli import run_cli

# A preset, a group applied after it, and a length typed over the preset's: what finalise_config decides.
OVERRIDES = [
    "experiment=toy10",
    "trainer=smoke",
    "trainer.epochs=1",
    "tasks.n_train=64",
    "tasks.n_val=32",
    "tasks.n_test=32",
    "logger=csv",
]


def test_the_cli_and_the_python_api_train_the_same_config(tmp_path):
    cli_dir, api_dir = tmp_path / "cli", tmp_path / "api"
    result = run_cli("train", *OVERRIDES, f"hydra.run.dir={cli_dir}")
    assert result.returncode == 0, result.stderr
    run(OVERRIDES, api_dir)
    trained = {
        where: torch.load(d / "checkpoints" / "last.pt", weights_only=True)["config"]
        for where, d in [("cli", cli_dir), ("api", api_dir)]
    }
    assert trained["cli"] == trained["api"]
    config = OmegaConf.create(trained["api"])
    assert (config.trainer.max_steps, config.trainer.epochs, config.trainer.eval_every) == (None, 1, 10)  # finalised
    records = {where: json.loads((d / "metrics.json").read_text()) for where, d in [("cli", cli_dir), ("api", api_dir)]}
    for key in ("choices", "overrides", "step", "test", "val"):
        assert records["cli"][key] == records["api"][key], key
    assert records["api"]["choices"]["experiment"] == "toy10" and records["api"]["step"] == 2


def test_compose_config_is_what_the_cli_prints_for_cfg_job():
    result = run_cli("train", "--cfg", "job", *OVERRIDES)
    assert result.returncode == 0, result.stderr
    assert OmegaConf.create(result.stdout) == compose_config(OVERRIDES)
