"""Gradient clipping, the logged total norm, and the anomalous-parameter check (mmcv OptimizerHook)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtl_bench.config import GradClipConf
from mtl_bench.engine.anomalous import parameters_outside_graph
from mtl_bench.engine.gradients import clip_gradients


def params_with_grads(*grads: list[float]) -> list[nn.Parameter]:
    params = [nn.Parameter(torch.zeros(len(g))) for g in grads]
    for p, g in zip(params, grads):
        p.grad = torch.tensor(g)
    return params


def test_clip_by_norm_returns_the_norm_before_clipping_and_scales_to_max_norm():
    params = params_with_grads([3.0, 0.0], [0.0, 4.0])  # global L2 norm 5
    norm = clip_gradients(params, GradClipConf(max_norm=1.0), measure=False)
    assert norm.item() == pytest.approx(5.0)
    assert torch.cat([p.grad for p in params]).tolist() == pytest.approx([0.6, 0.0, 0.0, 0.8], rel=1e-5)


def test_clip_by_norm_leaves_small_gradients_and_honours_norm_type():
    params = params_with_grads([1.0, -2.0])
    norm = clip_gradients(params, GradClipConf(max_norm=10.0, norm_type=1.0), measure=False)
    assert norm.item() == pytest.approx(3.0)  # L1
    assert params[0].grad.tolist() == [1.0, -2.0]


def test_clip_by_value_measures_only_when_asked():
    params = params_with_grads([0.5, -3.0, 2.0])
    assert clip_gradients(params, GradClipConf(clip_value=1.0), measure=False) is None
    assert params[0].grad.tolist() == [0.5, -1.0, 1.0]
    params = params_with_grads([3.0, 4.0])
    assert clip_gradients(params, GradClipConf(), measure=True).item() == pytest.approx(5.0)
    assert params[0].grad.tolist() == [3.0, 4.0]


def test_parameters_outside_the_graph_are_named():
    used, unused, frozen = nn.Linear(2, 1), nn.Linear(2, 1), nn.Linear(2, 1)
    frozen.requires_grad_(False)
    x = torch.ones(3, 2)
    loss = (used(x) + frozen(x)).sum() + unused(x).detach().sum()  # detached: cut off from the loss
    model = nn.ModuleDict({"used": used, "unused": unused, "frozen": frozen})
    assert parameters_outside_graph([loss], model.named_parameters()) == ["unused.weight", "unused.bias"]
