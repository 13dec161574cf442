"""Parsers of the settings that take several forms (`num_threads`, `compile`, lengths in steps, epochs or % of the
run): torch-free, so the config's value checks (config.py) and the engine that applies them read one definition."""

from __future__ import annotations

from typing import Any, Optional, Union

Setting = Union[str, int, None]
CompileSetting = Union[bool, str, None]
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_setting(setting: Any) -> Setting:
    """`setting` as None, "auto" or an int > 0 (its string is read as the int); ValueError naming
    trainer.num_threads otherwise."""
    bad = ValueError(f"trainer.num_threads: must be auto, null or an integer > 0, got {setting!r}")
    if setting is None:
        return None
    if isinstance(setting, bool) or not isinstance(setting, (int, str)):
        raise bad
    if isinstance(setting, str):
        if setting.strip().lower() == "auto":
            return "auto"
        if setting.strip().lower() in ("null", "none"):
            return None
        try:
            setting = int(setting.strip())
        except ValueError:
            raise bad from None
    if setting < 1:
        raise bad
    return setting


def compile_mode(setting: CompileSetting) -> Optional[str]:
    """None for no compilation, else the mode ("default" for true). ValueError naming trainer.compile for
    anything else."""
    if setting is None or setting is False:
        return None
    if setting is True:
        return "default"
    if isinstance(setting, str):
        value = setting.strip().lower()
        if value == "false":
            return None
        if value == "true":
            return "default"
        if value in MODES:
            return value
    raise ValueError(f"trainer.compile: must be false, true or one of {', '.join(MODES)}; got {setting!r}")


Length = Union[int, str]


def to_steps(name: str, value: Length, steps_per_epoch: int = 1, total_steps: Optional[int] = None) -> int:
    """An optimizer-step count from `value`: an int (steps), "<x> epochs" or "<x>%" (of the run's steps)."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: must be steps, '<n> epochs' or '<p>%', got {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip().lower()
    try:
        if text.endswith("%"):
            if total_steps is None:
                raise ValueError(f"{name}: {value!r} needs the run's length, which this schedule is not given")
            return round(float(text[:-1]) / 100 * total_steps)
        for unit in ("epochs", "epoch", "ep"):
            if text.endswith(unit):
                return round(float(text[: -len(unit)]) * steps_per_epoch)
        return int(text)
    except ValueError as err:
        if str(err).startswith(name):
            raise
        raise ValueError(f"{name}: must be steps, '<n> epochs' or '<p>%', got {value!r}") from None
