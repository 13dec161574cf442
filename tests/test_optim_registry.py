"""Optimizer classes by name or import path, as mmcv's custom optimizers (`optim=custom`)."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.config import CustomOptimConf
from mtl_bench.errors import ConfigError
from mtl_bench.optim import ScaledAdam, build_optimizer, resolve_optimizer_class


class SignSGD(torch.optim.Optimizer):
    """p <- p - lr * sign(grad): a user's own optimizer, defined outside mtl_bench."""

    def __init__(self, params, lr: float = 0.01, weight_decay: float = 0.0, flip: bool = False) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "flip": flip})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            sign = -1.0 if group["flip"] else 1.0
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"] * sign)


def test_names_resolve_to_torch_and_our_classes():
    assert resolve_optimizer_class("RMSprop") is torch.optim.RMSprop
    assert resolve_optimizer_class("ScaledAdam") is ScaledAdam
    assert resolve_optimizer_class("torch.optim.NAdam") is torch.optim.NAdam


def test_a_class_from_a_user_module_is_built_and_steps():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    conf = CustomOptimConf(class_path=f"{__name__}.SignSGD", lr=0.5, kwargs={"flip": False})
    opt = build_optimizer(conf, [p])
    assert isinstance(opt, SignSGD)
    (p * torch.tensor([3.0, -0.1])).sum().backward()
    opt.step()
    assert p.tolist() == [0.5, -1.5]


@pytest.mark.parametrize("path, message", [
    ("Adamm", "no optimizer named 'Adamm'; use one of .*RMSprop"),
    ("no_such_pkg.Opt", "cannot import module 'no_such_pkg'"),
    ("torch.optim.Nope", "module 'torch.optim' has no attribute 'Nope'"),
    ("torch.nn.Linear", "torch.nn.Linear is not a torch.optim.Optimizer subclass"),
])
def test_bad_class_paths_are_one_line_config_errors(path, message):
    with pytest.raises(ConfigError, match=f"optim.class_path='{path}': {message}"):
        build_optimizer(CustomOptimConf(class_path=path), [torch.nn.Parameter(torch.ones(1))])


def test_unknown_constructor_argument_is_a_config_error():
    conf = CustomOptimConf(class_path="SGD", kwargs={"momentun": 0.9})
    with pytest.raises(ConfigError, match="optim.kwargs: SGD rejects the arguments"):
        build_optimizer(conf, [torch.nn.Parameter(torch.ones(1))])
