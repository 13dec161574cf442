"""Hard-sharing models: structure, the last shared layer, shared vs head parameters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtl_bench.models import MODELS, ModelOutput, build_lenet, build_mlp


def test_paper_toy_mlp_parameter_count():
    # GradNorm sec. 4: 4 FC ReLU layers of 100 units, one affine head per task (T = 10, out_dim 100).
    model = build_mlp((250,), {f"t{i}": 100 for i in range(10)})
    trunk = 250 * 100 + 100 + 3 * (100 * 100 + 100)
    heads = 10 * (100 * 100 + 100)
    assert sum(p.numel() for p in model.shared_parameters()) == trunk == 55_400
    assert sum(p.numel() for p in model.parameters()) == trunk + heads == 156_400
    assert sum(isinstance(m, nn.Linear) for m in model.trunk.modules()) == 4
    assert sum(isinstance(m, nn.ReLU) for m in model.trunk.modules()) == 4
    assert all(type(head) is nn.Linear for head in model.heads.values())  # affine heads, as in the paper


def test_forward_returns_shared_representation_and_one_prediction_per_task():
    model = build_mlp((250,), {"a": 3, "b": 1}, widths=[16, 8])
    out = model(torch.randn(5, 250))
    assert isinstance(out, ModelOutput) and out.shared.shape == (5, 8)
    assert {k: v.shape for k, v in out.preds.items()} == {"a": (5, 3), "b": (5, 1)}
    torch.testing.assert_close(out.preds["a"], model.heads["a"](out.shared))  # heads read `shared`


def test_lenet_on_digit_pairs():
    model = build_lenet((1, 8, 12), {"left": 10, "right": 10, "sum": 1})
    out = model(torch.rand(6, 1, 8, 12))
    assert out.shared.shape == (6, 50)
    assert {k: v.shape for k, v in out.preds.items()} == {"left": (6, 10), "right": (6, 10), "sum": (6, 1)}
    # 8x12 -> pool -> 4x6 -> pool -> 2x3, 20 channels: the hidden Linear reads 20 * 2 * 3 = 120 features.
    assert model.last_shared_layer.in_features == 120 and model.last_shared_layer.out_features == 50
    convs = [m for m in model.trunk.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.padding) for c in convs] == [(10, (3, 3), (1, 1)), (20, (3, 3), (1, 1))]
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.trunk.modules()) == 2
    assert all(type(head) is nn.Linear for head in model.heads.values())
    assert build_lenet((1, 8, 16), {"a": 1}).last_shared_layer.in_features == 20 * 2 * 4
    assert build_lenet((1, 8, 8), {"a": 1}, channels=[4], hidden=7)(torch.rand(2, 1, 8, 8)).shared.shape == (2, 7)


@pytest.mark.parametrize("build,shape,kwargs", [
    (build_mlp, (250,), {}),
    (build_mlp, (3, 4), {"activation": "tanh"}),
    (build_mlp, (250,), {"activation": "gelu", "widths": [7]}),
    (build_lenet, (1, 8, 12), {}),
])
def test_last_shared_layer_is_the_trunks_last_linear_and_feeds_shared(build, shape, kwargs):
    model = build(shape, {"a": 10, "b": 1}, **kwargs)
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
    for model in (build_lenet((1, 8, 12), {"left": 10, "sum": 1}), build_mlp((5,), {"a": 2, "b": 3})):
        shared = {id(p) for p in model.shared_parameters()}
        heads = {id(p) for p in model.heads.parameters()}
        assert shared and heads and not (shared & heads)
        assert shared | heads == {id(p) for p in model.parameters()}
        assert {id(p) for p in model.last_shared_layer.parameters()} <= shared
        assert {id(p) for p in model.task_parameters("a" if "a" in model.heads else "left")} <= heads
        assert "_last_shared_layer" not in dict(model.named_modules())  # not registered twice


def test_bad_options_name_the_allowed_values():
    with pytest.raises(ValueError, match="relu, tanh, gelu"):
        build_mlp((4,), {"a": 1}, activation="swish")
    with pytest.raises(ValueError, match="widths"):
        build_mlp((4,), {"a": 1}, widths=[])
    with pytest.raises(ValueError, match="too small"):
        build_lenet((1, 2, 2), {"a": 1}, channels=[4, 4])
    with pytest.raises(ValueError, match="input_shape"):
        build_lenet((8, 12), {"a": 1})


def test_same_seed_same_initial_weights():
    def weights(seed: int, build, shape) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return list(build(shape, {"a": 2}).state_dict().values())

    for build, shape in ((build_mlp, (10,)), (build_lenet, (1, 8, 12))):
        assert all(torch.equal(x, y) for x, y in zip(weights(0, build, shape), weights(0, build, shape)))
        assert not all(torch.equal(x, y) for x, y in zip(weights(0, build, shape), weights(1, build, shape)))


def test_registry():
    assert MODELS == {"mlp": build_mlp, "lenet": build_lenet}
