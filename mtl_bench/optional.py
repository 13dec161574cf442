"""Imports of packages only some parts need (torchvision), done when a part is built, never when mtl_bench is
imported: `mtl-bench train` with the default MLP, `--help` and `report` work without them."""

from __future__ import annotations

import importlib
from types import ModuleType

from mtl_bench.errors import ConfigError


def torchvision_module(needed_by: str, name: str = "torchvision") -> ModuleType:
    """`import <name>` (torchvision or one of its modules); a ConfigError naming `needed_by` and the install
    command when it cannot be imported. Not only ImportError: a torchvision built for another torch fails at
    import with a RuntimeError."""
    try:
        return importlib.import_module(name)
    except Exception as err:  # ImportError, or RuntimeError/AttributeError from a torch/torchvision mismatch
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(
            f"torchvision, which {needed_by} needs, cannot be imported here ({type(err).__name__}: {reason}); "
            "pip install torchvision (the build that matches your torch)"
        ) from None
