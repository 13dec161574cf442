"""mmcv DefaultOptimizerConstructor semantics for parameter groups (mmcv tests/test_runner/test_optimizer.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtl_bench.errors import ConfigError
from mtl_bench.optim import build_param_groups

BASE_LR, BASE_WD = 0.01, 0.0001


class SubModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 2, kernel_size=1, groups=2)  # depthwise
        self.gn = nn.GroupNorm(2, 2)
        self.param1 = nn.Parameter(torch.ones(1))


class ExampleModel(nn.Module):
    """The model of mmcv's optimizer-constructor tests."""

    def __init__(self) -> None:
        super().__init__()
        self.param1 = nn.Parameter(torch.ones(1))
        self.conv1 = nn.Conv2d(3, 4, kernel_size=1, bias=False)
        self.conv2 = nn.Conv2d(4, 2, kernel_size=1)
        self.bn = nn.BatchNorm2d(2)
        self.sub = SubModel()
        self.fc = nn.Linear(2, 1)


def settings(groups: list[dict]) -> dict[str, tuple[float, float]]:
    """parameter name -> (lr, weight_decay), checking that names and tensors agree."""
    out = {}
    for group in groups:
        assert len(group["params"]) == len(group["param_names"])
        for name in group["param_names"]:
            assert name not in out, f"{name} in two groups"
            out[name] = (group["lr"], group["weight_decay"])
    return out


def test_without_paramwise_there_is_one_default_group():
    model = ExampleModel()
    groups = build_param_groups(model, BASE_LR, BASE_WD, None)
    assert len(groups) == 1 and groups[0]["name"] == "default"
    assert groups[0]["params"] == list(model.parameters())


def test_bias_norm_and_depthwise_rules_as_mmcv():
    cfg = {"bias_lr_mult": 2.0, "bias_decay_mult": 0.5, "norm_decay_mult": 0.0, "dwconv_decay_mult": 0.1}
    got = settings(build_param_groups(ExampleModel(), BASE_LR, BASE_WD, cfg))
    base = (BASE_LR, BASE_WD)
    expected = {
        "param1": base,
        "conv1.weight": base,
        "conv2.weight": base,
        "conv2.bias": (BASE_LR * 2, BASE_WD * 0.5),
        "bn.weight": (BASE_LR, 0.0),
        "bn.bias": (BASE_LR, 0.0),  # norm-layer biases keep the base lr
        "sub.param1": base,
        "sub.conv1.weight": (BASE_LR, BASE_WD * 0.1),
        "sub.conv1.bias": (BASE_LR * 2, BASE_WD * 0.1),  # depthwise decay rule beats the bias decay rule
        "sub.gn.weight": (BASE_LR, 0.0),
        "sub.gn.bias": (BASE_LR, 0.0),
        "fc.weight": base,
        "fc.bias": (BASE_LR * 2, BASE_WD * 0.5),
    }
    assert got.keys() == expected.keys()
    for name, values in expected.items():
        assert got[name] == pytest.approx(values), name


def test_custom_keys_longest_match_wins_ties_alphabetical_and_other_rules_are_off():
    cfg = {
        "bias_lr_mult": 2.0,
        "custom_keys": {
            "sub": {"lr_mult": 0.1},
            "sub.gn": {"lr_mult": 0.01, "decay_mult": 0.0},  # longer than "sub": wins for sub.gn.*
            "conv": {"lr_mult": 3.0},  # same length as "sub.": alphabetically first, wins for sub.conv1.*
            "sub.": {"lr_mult": 5.0},
            "fc": {"decay_mult": 0.5},  # fc.bias: bias_lr_mult no longer applies
        },
    }
    got = settings(build_param_groups(ExampleModel(), BASE_LR, BASE_WD, cfg))
    assert got["sub.gn.weight"] == pytest.approx((BASE_LR * 0.01, 0.0))
    assert got["sub.conv1.bias"] == pytest.approx((BASE_LR * 3.0, BASE_WD))
    assert got["sub.param1"] == pytest.approx((BASE_LR * 5.0, BASE_WD))
    assert got["fc.bias"] == pytest.approx((BASE_LR, BASE_WD * 0.5))
    assert got["conv2.bias"] == pytest.approx((BASE_LR * 3.0, BASE_WD))  # "conv" is a substring of conv2
    assert got["param1"] == pytest.approx((BASE_LR, BASE_WD))


def test_groups_with_equal_settings_are_merged_and_named():
    groups = build_param_groups(ExampleModel(), BASE_LR, BASE_WD, {"norm_decay_mult": 0.0, "bias_lr_mult": 10.0})
    names = {g["name"]: len(g["params"]) for g in groups}
    # default: param1, conv1.w, conv2.w, sub.param1, sub.conv1.w, fc.w; norms: 4 tensors; biases: conv2, sub.conv1, fc
    assert names == {"default": 6, "wd_x0": 4, "lr_x10": 3}


def test_frozen_parameters_are_left_out():
    model = ExampleModel()
    model.fc.requires_grad_(False)
    got = settings(build_param_groups(model, BASE_LR, BASE_WD, {"bias_lr_mult": 2.0}))
    assert "fc.weight" not in got and "fc.bias" not in got and "conv2.bias" in got


def test_shared_module_is_an_error_unless_bypassed():
    model = ExampleModel()
    model.fc_again = model.fc
    with pytest.raises(ConfigError, match="fc_again.weight is the same tensor as fc.weight.*bypass_duplicate"):
        build_param_groups(model, BASE_LR, BASE_WD, {"bias_lr_mult": 2.0})
    got = settings(build_param_groups(model, BASE_LR, BASE_WD, {"bias_lr_mult": 2.0, "bypass_duplicate": True}))
    assert "fc.weight" in got and "fc_again.weight" not in got
    plain = build_param_groups(model, BASE_LR, BASE_WD, None)
    assert len(plain[0]["params"]) == len(list(model.parameters()))  # no config: kept once, as model.parameters()


def test_without_weight_decay_groups_carry_no_decay_key():
    groups = build_param_groups(ExampleModel(), BASE_LR, None, {"bias_lr_mult": 2.0})
    assert all("weight_decay" not in g for g in groups)


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"bias_lr": 2.0}, "unknown key 'bias_lr'; allowed: custom_keys"),
        ({"custom_keys": {"fc": {"lr": 2.0}}}, "custom_keys.fc: unknown field lr; allowed: lr_mult, decay_mult"),
    ],
)
def test_unknown_keys_are_named(cfg, message):
    with pytest.raises(ConfigError, match=message):
        build_param_groups(ExampleModel(), BASE_LR, BASE_WD, cfg)


def test_optimizer_uses_the_group_values():
    model = ExampleModel()
    groups = build_param_groups(model, BASE_LR, BASE_WD, {"custom_keys": {"fc": {"lr_mult": 0.0}}})
    opt = torch.optim.SGD(groups, lr=BASE_LR, weight_decay=BASE_WD)
    before = model.fc.weight.detach().clone()
    model.fc(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert torch.equal(model.fc.weight, before)  # lr 0: unchanged
