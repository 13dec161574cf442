"""A run's hyper-parameters as flat {dotted key: value} (what every logger's log_hparams receives)."""

from __future__ import annotations

from typing import Any, Mapping


def flatten_hparams(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> {"optim.lr": 0.001, ...} with only the value types TensorBoard's hparams accept."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_hparams(value, prefix=f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:  # lists, None
            flat[name] = str(value)
    return flat


HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")  # instantiate's, not the user's


def hparam_values(config: Mapping[str, Any], choices: Mapping[str, str]) -> dict[str, Any]:
    """What the HParams tab shows: each config group's option (`balancer: gradnorm`) and the option's values
    (`balancer.alpha: 1.5`), without Hydra's instantiate keys (`_target_`, `_partial_`, ...), Hydra's own
    settings (`hydra.*`), the task set's reference numbers (`tasks.reference.*`, read by the report only) and where
    the run logs (`logger`, `logger.*`: not a hyper-parameter).

    `config` is the resolved run config as a plain dict; `choices` the group options ({"optim/schedule": "none"}).
    """
    values: dict[str, Any] = {
        g.replace("/", "."): str(o) for g, o in choices.items() if not g.startswith(("hydra", "logger"))
    }
    for key, value in flatten_hparams(config).items():
        parts = key.split(".")
        if parts[0] in ("hydra", "logger") or parts[-1] in HYDRA_KEYS or parts[:2] == ["tasks", "reference"]:
            continue
        if key in values:  # a key named like a group (never expected): the option stays, the value is kept apart
            key = f"{key}.value"
        values[key] = value
    return values
