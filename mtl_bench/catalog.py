"""What conf/ offers: group -> option names, read from the YAML files (no Hydra, no torch)."""

from __future__ import annotations

from pathlib import Path

GROUPS = (
    "model",
    "model/arch",
    "model/front",
    "tasks",
    "balancer",
    "optim",
    "optim/schedule",
    "precision",
    "select",
    "logger",
    "trainer",
    "experiment",
)


def conf_root() -> Path:
    package = Path(__file__).resolve().parent
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"mtl-bench cannot find its conf/ directory next to {package}")


def config_options() -> dict[str, list[str]]:
    root = conf_root()
    return {group: sorted(p.stem for p in (root / group).glob("*.yaml")) for group in GROUPS}


def group_keys() -> dict[str, str]:
    """Config key of each group: optim/schedule is optim.schedule."""
    return {group: group.replace("/", ".") for group in GROUPS}


def format_config_options(width: int | None = None) -> str:
    """One line per group, as in `mtl-bench list`; with `width`, each wrapped within it (`mtl-bench train --help`)."""
    import textwrap

    lines = [f"{group}: {', '.join(choices)}" for group, choices in config_options().items()]
    if width is None:
        return "\n".join(lines)
    return "\n".join(
        textwrap.fill(
            line, width, initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False, break_long_words=False
        )
        for line in lines
    )
