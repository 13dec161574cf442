"""LibMTL 1.1.5's modules loaded from its installed files, for the exactness tests and the peer benchmarks.

LibMTL's package `__init__` imports a torchvision module that no longer exists, so `import LibMTL` fails on
current torchvision; the package and subpackage are stand-ins and each module is loaded from its file.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, Sequence

import torch

from mtl_bench.models.base import MultiTaskModel

MISSING = "LibMTL (the peers extra) is not installed: pip install -e '.[peers]'"


def libmtl_root() -> Path:
    """The installed LibMTL package's folder; ModuleNotFoundError naming the extra when it is absent."""
    if "LibMTL" in sys.modules:
        return Path(list(sys.modules["LibMTL"].__path__)[0])
    spec = importlib.util.find_spec("LibMTL")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(MISSING, name="LibMTL")
    return Path(list(spec.submodule_search_locations)[0])


def libmtl_module(
    name: str, package: str = "weighting", needs: Sequence[str] = ("abstract_weighting",)
) -> types.ModuleType:
    """The module `LibMTL.<package>.<name>` from its installed file, after the modules it imports (`needs`)."""
    root = libmtl_root()
    for stand_in, path in (("LibMTL", root), (f"LibMTL.{package}", root / package)):
        if stand_in not in sys.modules or not hasattr(sys.modules[stand_in], "__path__"):
            module = types.ModuleType(stand_in)
            module.__path__ = [str(path)]
            sys.modules[stand_in] = module
    for module_name in (*needs, name):
        full = f"LibMTL.{package}.{module_name}"
        if full not in sys.modules:
            module_spec = importlib.util.spec_from_file_location(full, root / package / f"{module_name}.py")
            assert module_spec is not None and module_spec.loader is not None, full
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[full] = module
            module_spec.loader.exec_module(module)
    return sys.modules[f"LibMTL.{package}.{name}"]


def load_libmtl(name: str) -> Any:
    """A LibMTL weighting class, e.g. `load_libmtl("PCGrad")`."""
    return getattr(libmtl_module(name), name)


def libmtl_weighting(name: str, model: MultiTaskModel, tasks: Sequence[str], rep_grad: bool = False) -> Any:
    """The weighting as LibMTL's trainer mixes it into the model: the shared parameters are the trunk's."""
    base = load_libmtl(name)

    class Weighting(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.task_num, self.task_name, self.rep_grad = len(tasks), list(tasks), rep_grad
            self.device = next(model.parameters()).device
            self.__dict__["encoder"] = model.trunk

        def get_share_params(self) -> Any:
            return model.trunk.parameters()

        def zero_grad_share_params(self) -> None:
            model.trunk.zero_grad(set_to_none=False)

    weighting = Weighting()
    weighting.init_param()
    return weighting


def restore_dselect_k_codes(module: Any) -> None:
    """LibMTL 1.1.5's DSelect_k builds its experts' binary codes with NumPy calls that give all ones under NumPy 2
    (every expert then gets the same weight): put back the codes NumPy 1 gives (expert e's bits, most significant
    first), so that the peer computes what its authors ran (tests/models/test_archs.py shows the difference)."""
    bits = module._num_binary
    codes = [[(e >> (bits - 1 - b)) & 1 for b in range(bits)] for e in range(module.num_experts)]
    device = next(module.parameters()).device
    module._binary_codes = torch.tensor(codes, dtype=torch.bool, device=device).unsqueeze(0)
