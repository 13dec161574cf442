"""ImageNet weights for the torchvision backbones (resnet_dilated, resnet18), read from a local file: torchvision's own
state dicts (the files `torchvision.models.ResNet50_Weights` / `ResNet18_Weights` download), nothing downloaded here.

LibMTL (median-research-group/LibMTL 4336804, LibMTL/model/resnet.py) builds its encoders with `pretrained=True`:
torchvision's ResNet state dict, loaded with `strict=False` after dropping the classifier. Here the classifier
(`fc.*`) is ignored the same way, and every other key must fit: a wrong or partial file is an error, not a silently
half-initialised encoder.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Optional

import torch
from torch import nn

log = logging.getLogger("mtl_bench")

# torchvision's file of each backbone's ImageNet weights (the V1 weights LibMTL downloads, under their current name;
# LibMTL's URLs name the older copies resnet50-19c8e357.pth and resnet18-5c106cde.pth, which load here as well).
IMAGENET_FILES = {
    "resnet50": "resnet50-0676ba61.pth (torchvision.models.ResNet50_Weights.IMAGENET1K_V1)",
    "resnet18": "resnet18-f37072fd.pth (torchvision.models.ResNet18_Weights.IMAGENET1K_V1)",
}
IGNORED_PREFIX = "fc."  # the ImageNet classifier: the multi-task models have no use for it


def _keys(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def load_backbone_weights(backbone: nn.Module, weights: Optional[str], arch: str) -> None:
    """Load `weights` (a path to a torchvision state dict of `arch`) into `backbone`, a torchvision ResNet of that
    architecture without its classifier, or with it (`fc.*` is ignored on both sides).

    weights None: nothing is loaded and one warning says that the run starts from random initialisation while
    published numbers use ImageNet-pretrained encoders, naming the torchvision file to pass.
    Raises ValueError starting with `weights:` and naming the path for a missing file, a file that is not a state
    dict, or keys that are missing, unexpected or of another shape.
    """
    file_name = IMAGENET_FILES.get(arch, f"torchvision's ImageNet weights of {arch}")
    if weights is None:
        log.warning(
            "model: the %s encoder starts from random initialisation; published numbers (LibMTL's tables) use "
            "ImageNet-pretrained encoders: pass model.weights=<path to %s>",
            arch,
            file_name,
        )
        return
    if not isinstance(weights, (str, Path)) or not str(weights):
        raise ValueError(f"weights: need a path to a torchvision state dict ({file_name}) or null, got {weights!r}")
    path = Path(weights).expanduser()
    if not path.is_file():
        raise ValueError(f"weights: no file at {path} (expected torchvision's {file_name})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling errors of every kind: the file is not a tensor-only torch file
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(
            f"weights: {path} is not a state dict torch.load reads with weights_only=True ({reason})"
        ) from None
    if (
        not isinstance(state, Mapping)
        or not state
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    ):
        raise ValueError(
            f"weights: {path} is not a state dict (a mapping of parameter names to tensors), got {type(state).__name__}"
        )
    given = {k: v for k, v in state.items() if not k.startswith(IGNORED_PREFIX)}
    expected = {k: v for k, v in backbone.state_dict().items() if not k.startswith(IGNORED_PREFIX)}
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    misshaped = [
        f"{k} {tuple(given[k].shape)} for {tuple(v.shape)}"
        for k, v in expected.items()
        if k in given and given[k].shape != v.shape
    ]
    if missing or unexpected or misshaped:
        problems = [
            f"{len(names)} {what} ({_keys(names)})"
            for what, names in (("missing keys", missing), ("unexpected keys", unexpected), ("mis-shaped", misshaped))
            if names
        ]
        raise ValueError(f"weights: {path} does not fit torchvision's {arch}: {'; '.join(problems)}")
    backbone.load_state_dict(given, strict=False)  # strict=False only for the classifier, checked above
    log.info("model: %s encoder loaded from %s", arch, path)
