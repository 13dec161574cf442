"""Hydra's composition errors as one line that names the bad key or value and what is allowed."""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Callable, Optional

from hydra.errors import MissingConfigException, OverrideParseException

from mtl_bench.catalog import config_options, group_keys

# Launchers and sweepers beyond Hydra's basic ones come from plugins, installed by our extras.
PLUGIN_GROUPS = {
    "hydra/launcher": "joblib and submitit_* come with: pip install 'mtl-bench[sweep]'",
    "hydra/sweeper": "optuna comes with: pip install 'mtl-bench[optuna]'",
}

# Hydra's messages end with a config search path or a link to the grammar docs: noise for a user.
_NOISE = re.compile(r"^(Config search path:|\s*provider=|See https://hydra\.cc|To append to your config)")


def closest(name: str, allowed: list[str], prefix: str = "") -> str:
    """' (did you mean x?)' for the closest allowed name (shown after `prefix`: the full key), or ''."""
    match = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    return f" (did you mean {prefix}{match[0]}?)" if match else ""


def _first_lines(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not _NOISE.match(line)]
    return "; ".join(line for line in lines if not line.startswith(("full_key:", "object_type=", "reference_type=")))


def _allowed_keys(object_type: object) -> str:
    if dataclasses.is_dataclass(object_type):
        return ", ".join(field.name for field in dataclasses.fields(object_type) if field.name != "name")
    return ""


def _as_choice(path: str) -> str:
    """'hydra/launcher/slurm' -> 'hydra/launcher=slurm'."""
    group, _, option = path.rpartition("/")
    return f"{group}={option}"


# A part's keys (its YAML's and its class's options), given the part's config key and the bad key; None when they
# cannot be found. The caller supplies it (engine/compose.py part_keys): finding them builds the config again.
PartKeys = Callable[[str, str], Optional[list[str]]]


def describe(err: BaseException, part_keys: Optional[PartKeys] = None) -> str:
    """One line for an error Hydra raised while parsing the overrides or composing the config."""
    if isinstance(err, MissingConfigException):
        found = re.search(r"Could not find '([^']+)'", str(err))
        options = re.findall(r"^\t(\S+)$", str(err).split("Config search path:")[0], flags=re.M)
        if found and "/" in found.group(1) and options:
            group, option = found.group(1).rsplit("/", 1)
            message = f"{group}={option}: no such option{closest(option, options)}; allowed: {', '.join(options)}"
            if group in PLUGIN_GROUPS:
                message += f" ({PLUGIN_GROUPS[group]})"
            return message
        preset = re.search(r"In '([^']+)': Could not load '([^']+)'", str(err))
        if preset:  # one of our presets (hydra/launcher=slurm) extends a plugin's config that is missing
            group = preset.group(2).rsplit("/", 1)[0]
            hint = f" ({PLUGIN_GROUPS[group]})" if group in PLUGIN_GROUPS else ""
            return f"{_as_choice(preset.group(1))}: needs {preset.group(2)}, which is not installed{hint}"
        return _first_lines(str(err))
    if isinstance(err, OverrideParseException):
        return f"cannot parse the override ({_first_lines(str(err))}); the form is key=value or group=option"
    cause = err.__cause__
    full_key = getattr(cause, "full_key", None)
    if cause is None or not full_key:
        return _first_lines(str(err))
    object_type = getattr(cause, "object_type", None)
    reason = _first_lines(str(cause))
    if type(cause).__name__ in ("ConfigAttributeError", "ConfigKeyError"):
        allowed = _allowed_keys(object_type)
        section, _, last = full_key.rpartition(".")
        names = [name.strip() for name in allowed.split(",")] if allowed else []
        if not section and not names:  # the top level: its keys are the groups and the run-level options
            names = list(group_keys().values()) + ["trainer", "seed", "tag"]
        message = f"{full_key}: no such key{closest(last, names + list(config_options()))}"
        message += f"; keys of {section or 'the config'}: {', '.join(names)}" if names else ""
        groups = {key: group for group, key in group_keys().items()}
        if last == "name" and section in groups:
            choices = ", ".join(config_options()[groups[section]])
            message += f"; choose an option with {groups[section]}=<option> ({choices})"
        elif section in groups and section != "trainer":  # a part: its keys are its YAML's and its class's
            keys = part_keys(section, full_key) if part_keys is not None else None
            if keys is None:
                message += f" (a new key needs a plus: +{full_key}=...; see the keys with mtl-bench train --cfg job)"
            elif last in keys:  # an option of the class that the YAML does not set
                message = (
                    f"{full_key}: not set by the {groups[section]} option's YAML; add it with a plus: +{full_key}=..."
                )
            else:
                message = (
                    f"{full_key}: no such key{closest(last, keys, prefix=section + '.')}; keys of {section}: "
                    + ", ".join(keys)
                )
        return message
    return f"{full_key}: {reason}"
