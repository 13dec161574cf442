"""Optimizer classes chosen by name from config, like mmcv's custom optimizers (OPTIMIZERS registry)."""

from __future__ import annotations

import importlib
import inspect

import torch

from mtl_bench.optim.scaled_adam import ScaledAdam

_OWN = {"ScaledAdam": ScaledAdam}


def torch_optimizer_names() -> list[str]:
    """The optimizer classes torch.optim exports (Adam, SGD, RMSprop, ...)."""
    return sorted(name for name, obj in vars(torch.optim).items()
                  if inspect.isclass(obj) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer)


def resolve_optimizer_class(class_path: str) -> type[torch.optim.Optimizer]:
    """A torch.optim name (`RMSprop`), one of ours (`ScaledAdam`), or an import path (`my_pkg.optim.Lion`).

    Raises ValueError with one line saying what was wrong and what is allowed.
    """
    if "." not in class_path:
        cls = _OWN.get(class_path) or getattr(torch.optim, class_path, None)
        if not (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)):
            allowed = ", ".join(torch_optimizer_names() + sorted(_OWN))
            raise ValueError(f"no optimizer named {class_path!r}; use one of {allowed} or an import path pkg.module.Class")
        return cls
    module_name, _, attr = class_path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} ({err})") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
    if not (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)):
        raise ValueError(f"{class_path} is not a torch.optim.Optimizer subclass")
    return cls
