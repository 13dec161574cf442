"""Hard-sharing models: structure, the last shared layer, shared vs head parameters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtl_bench.engine.builders import build
from mtl_bench.models import MLP, LeNet, ModelOutput, MultiTaskModel


def test_paper_toy_mlp_parameter_count():
    # GradNorm sec. 4: 4 FC ReLU layers of 100 units, one affine head per task (T = 10, out_dim 100).
    model = MLP((250,), {f"t{i}": 100 for i in range(10)})
    trunk = 250 * 100 + 100 + 3 * (100 * 100 + 100)
    heads = 10 * (100 * 100 + 100)
    assert sum(p.numel() for p in model.shared_parameters()) == trunk == 55_400
    assert sum(p.numel() for p in model.parameters()) == trunk + heads == 156_400
    assert sum(isinstance(m, nn.Linear) for m in model.trunk.modules()) == 4
    assert sum(isinstance(m, nn.ReLU) for m in model.trunk.modules()) == 4
    assert all(type(head) is nn.Linear for head in model.heads.values())  # affine heads, as in the paper


def test_forward_returns_shared_representation_and_one_prediction_per_task():
    model = MLP((250,), {"a": 3, "b": 1}, widths=[16, 8])
    out = model(torch.randn(5, 250))
    assert isinstance(out, ModelOutput) and out.shared.shape == (5, 8)
    assert {k: v.shape for k, v in out.preds.items()} == {"a": (5, 3), "b": (5, 1)}
    torch.testing.assert_close(out.preds["a"], model.heads["a"](out.shared))  # heads read `shared`


def test_lenet_on_digit_pairs():
    model = LeNet((1, 8, 12), {"left": 10, "right": 10, "sum": 1})
    out = model(torch.rand(6, 1, 8, 12))
    assert out.shared.shape == (6, 50)
    assert {k: v.shape for k, v in out.preds.items()} == {"left": (6, 10), "right": (6, 10), "sum": (6, 1)}
    # 8x12 -> pool -> 4x6 -> pool -> 2x3, 20 channels: the hidden Linear reads 20 * 2 * 3 = 120 features.
    assert model.last_shared_layer.in_features == 120 and model.last_shared_layer.out_features == 50
    convs = [m for m in model.trunk.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.padding) for c in convs] == [(10, (3, 3), (1, 1)), (20, (3, 3), (1, 1))]
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.trunk.modules()) == 2
    assert all(type(head) is nn.Linear for head in model.heads.values())
    assert LeNet((1, 8, 16), {"a": 1}).last_shared_layer.in_features == 20 * 2 * 4
    assert LeNet((1, 8, 8), {"a": 1}, channels=[4], hidden=7)(torch.rand(2, 1, 8, 8)).shared.shape == (2, 7)


@pytest.mark.parametrize(
    "cls,shape,kwargs",
    [
        (MLP, (250,), {}),
        (MLP, (3, 4), {"activation": "tanh"}),
        (MLP, (250,), {"activation": "gelu", "widths": [7]}),
        (LeNet, (1, 8, 12), {}),
    ],
)
def test_last_shared_layer_is_the_trunks_last_linear_and_feeds_shared(cls, shape, kwargs):
    model = cls(shape, {"a": 10, "b": 1}, **kwargs)
    layer = model.last_shared_layer
    linears = [m for m in model.trunk.modules() if isinstance(m, nn.Linear)]
    assert layer is linears[-1]
    assert all(layer is not m for m in model.heads.modules())
    captured = {}
    layer.register_forward_hook(lambda m, i, o: captured.setdefault("out", o))
    out = model(torch.randn(4, *shape))
    act = {"tanh": torch.tanh, "gelu": nn.functional.gelu}.get(kwargs.get("activation"), torch.relu)
    assert torch.equal(out.shared, act(captured["out"]))  # nothing but the activation after it


def test_shared_parameters_exclude_heads():
    for model in (LeNet((1, 8, 12), {"left": 10, "sum": 1}), MLP((5,), {"a": 2, "b": 3})):
        shared = {id(p) for p in model.shared_parameters()}
        heads = {id(p) for p in model.heads.parameters()}
        assert shared and heads and not (shared & heads)
        assert shared | heads == {id(p) for p in model.parameters()}
        assert {id(p) for p in model.last_shared_layer.parameters()} <= shared
        assert {id(p) for p in model.task_parameters("a" if "a" in model.heads else "left")} <= heads
        assert "_last_shared_layer" not in dict(model.named_modules())  # not registered twice


def test_bad_options_name_the_allowed_values():
    # Each message starts with the argument's name (the engine reports it as `model.<name>: ...`).
    with pytest.raises(ValueError, match=r"^activation: 'swish' is not one of relu, tanh, gelu$"):
        MLP((4,), {"a": 1}, activation="swish")
    with pytest.raises(ValueError, match=r"^widths: "):
        MLP((4,), {"a": 1}, widths=[])
    with pytest.raises(ValueError, match=r"^channels: .*too small"):
        LeNet((1, 2, 2), {"a": 1}, channels=[4, 4])
    with pytest.raises(ValueError, match=r"^input_shape: "):
        LeNet((8, 12), {"a": 1})


def test_same_seed_same_initial_weights():
    def weights(seed: int, cls, shape) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return list(cls(shape, {"a": 2}).state_dict().values())

    for cls, shape in ((MLP, (10,)), (LeNet, (1, 8, 12))):
        assert all(torch.equal(x, y) for x, y in zip(weights(0, cls, shape), weights(0, cls, shape)))
        assert not all(torch.equal(x, y) for x, y in zip(weights(0, cls, shape), weights(1, cls, shape)))


@pytest.mark.parametrize("option, cls, shape", [("mlp", MLP, (250,)), ("lenet", LeNet, (1, 8, 12))])
def test_config_options_build_their_class(compose_cfg, option, cls, shape):
    # The MODELS registry is gone: each conf/model/<option>.yaml names its class by _target_.
    node = compose_cfg(f"model={option}").model
    torch.manual_seed(0)
    built = build("model", node, MultiTaskModel, input_shape=shape, heads={"a": 2})
    assert type(built) is cls
    torch.manual_seed(0)
    direct = cls(shape, {"a": 2})  # the option's values are the class's defaults
    assert built.state_dict().keys() == direct.state_dict().keys()
    assert all(torch.equal(x, y) for x, y in zip(built.state_dict().values(), direct.state_dict().values()))
