"""Architectures against LibMTL 1.1.5's (LibMTL/architecture/*.py, loaded from the installed files): the same
backbone, parameters copied across, the same outputs, the same parameters after SGD steps on the equally weighted
losses, the same parameter counts. Plus what LibMTL cannot check: the paper's cross-stitch units, DSelect-k's
regulariser on every task, the measurements, the stages each backbone declares."""

from __future__ import annotations

import copy
import re
import sys
import types
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import pytest
import torch
import torch.nn.functional as F
import torchvision
from omegaconf import OmegaConf
from torch import nn

from mtl_bench.catalog import conf_root
from mtl_bench.engine.builders import build, check_part, parameters
from mtl_bench.errors import ConfigError
from mtl_bench.models import MLP, CelebACNN, LeNet, MultiTaskModel, ResNet18, ResNetDilated
from mtl_bench.models.archs import CGC, HPS, LTB, MTAN, PLE, CrossStitch, DSelectK, MMoE
from tests.helpers.balancer_kit import libmtl_module

TASKS = ("a", "b")
OUT = {"a": 2, "b": 3}


class TinyResNet(MultiTaskModel):
    """A ResNet-shaped backbone small enough for CPU tests: conv1, bn1, relu, maxpool, layer1..layer4 (the
    attributes LibMTL's cross-stitch reads), pooled by the heads."""

    def __init__(self, input_shape: Sequence[int], heads: Mapping[str, int], arch: Any = None) -> None:
        trunk = self.make(int(input_shape[0]))
        task_heads = {
            t: nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, n)) for t, n in heads.items()
        }
        super().__init__(
            trunk,
            task_heads,
            trunk.layer4[0],
            stages=(5, 6, 7, 8),
            stem=4,
            make_trunk=lambda: self.make(int(input_shape[0])),
            input_shape=input_shape,
            arch=arch,
        )

    @staticmethod
    def make(channels: int) -> nn.Sequential:
        def layer(a: int, b: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU())

        return nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(channels, 4, 3, padding=1),
                bn1=nn.BatchNorm2d(4),
                relu=nn.ReLU(),
                maxpool=nn.MaxPool2d(2),
                layer1=layer(4, 4),
                layer2=layer(4, 6),
                layer3=layer(6, 8),
                layer4=layer(8, 8),
            )
        )


def ours(model_cls: Callable, shape: Sequence[int], arch: Callable, **options: Any) -> MultiTaskModel:
    return model_cls(shape, OUT, arch=lambda backbone: arch(backbone, **options))


def theirs(name: str, ours_model: MultiTaskModel, make_trunk: Callable, shape: Sequence[int], **kwargs: Any):
    """LibMTL's architecture `name` on the same encoder and copies of our heads as decoders."""
    needs = {"MMoE": ("abstract_arch",), "CGC": ("abstract_arch", "MMoE"), "DSelect_k": ("abstract_arch", "MMoE")}
    module = libmtl_module(name, package="architecture", needs=needs.get(name, ("abstract_arch",)))
    decoders = nn.ModuleDict({t: _copy(ours_model.heads[t]) for t in TASKS})
    ref = getattr(module, name)(
        list(TASKS), make_trunk, decoders, False, False, torch.device("cpu"), img_size=list(shape), **kwargs
    )
    if name == "DSelect_k":
        # LibMTL casts the strings '0'/'1' to bool: NumPy 1 parsed them, NumPy 2 takes any non-empty string as True,
        # so under NumPy 2 every code is all ones. Restore the codes LibMTL was written for (binary, MSB first).
        bits = ref._num_binary
        codes = [[(e >> (bits - 1 - b)) & 1 for b in range(bits)] for e in range(ref.num_experts)]
        ref._binary_codes = torch.tensor(codes, dtype=torch.bool).unsqueeze(0)
    return ref


def _copy(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module)


def their_name(arch: str, name: str) -> str:
    """Our parameter or buffer name -> LibMTL's."""
    name = re.sub(r"^heads\.", "decoders.", name)
    stem = {"conv1": 0, "bn1": 1, "relu": 2, "maxpool": 3}
    if arch == "PLE" and not name.startswith("decoders."):
        name = re.sub(r"^trunk\.", "encoder.", name)
        match = re.match(r"(encoder\.(?:shared_layer\.\d+|specific_layer\.\d+\.\w+)\.\d+)\.(\w+)\.(.*)", name)
        if match:
            head, first, tail = match.groups()
            return f"{head}.{stem[first]}.{tail}" if first in stem else f"{head}.{tail}"
        return name
    if arch != "Cross_stitch" or name.startswith("decoders."):
        return re.sub(r"^trunk\.", "", name)
    if name == "trunk.cross_unit":
        return "encoder.cross_unit"
    tn, stage, rest = re.match(r"trunk\.columns\.(\d+)\.(\d+)\.(.*)", name).groups()  # type: ignore[union-attr]
    first, tail = rest.split(".", 1)
    if first in stem:
        return f"encoder.resnet_conv.{TASKS[int(tn)]}.{stem[first]}.{tail}"
    return f"encoder.resnet_layer.{int(first[len('layer') :]) - 1}.{tn}.{tail}"


def copy_into_theirs(arch: str, model: MultiTaskModel, ref: nn.Module) -> None:
    state = {their_name(arch, k): v for k, v in model.state_dict().items()}
    ref.load_state_dict(state, strict=True)


def sgd_steps(forward: Callable, params: list[nn.Parameter], steps: int, x: torch.Tensor, y: dict) -> dict:
    opt = torch.optim.SGD(params, lr=0.1)
    preds = {}
    for step in range(steps):
        opt.zero_grad()
        preds = forward(x[step])
        sum(F.mse_loss(preds[t], y[t][step]) for t in TASKS).backward()
        opt.step()
    return preds


CASES = [
    # (LibMTL name, our architecture, our options, LibMTL's kwargs, backbone, input shape)
    ("MMoE", MMoE, {"num_experts": 3}, {"num_experts": [3]}, MLP, (5,)),
    ("MMoE", MMoE, {"num_experts": 2}, {"num_experts": [2]}, TinyResNet, (3, 8, 8)),
    ("CGC", CGC, {"num_shared": 2, "num_specific": 1}, {"num_experts": [2, 1, 1]}, MLP, (5,)),
    ("CGC", CGC, {"num_shared": 1, "num_specific": 2}, {"num_experts": [1, 2, 2]}, TinyResNet, (3, 8, 8)),
    ("DSelect_k", DSelectK, {"num_experts": 4, "num_nonzeros": 2}, {"num_experts": [4], "num_nonzeros": 2}, MLP, (5,)),
    ("Cross_stitch", CrossStitch, {"mixing": "libmtl"}, {}, TinyResNet, (3, 8, 8)),
    ("PLE", PLE, {"num_shared": 2, "num_specific": 1}, {"num_experts": [2, 1, 1]}, TinyResNet, (3, 8, 8)),
]


@pytest.mark.parametrize(("name", "arch", "options", "kwargs", "backbone", "shape"), CASES)
def test_same_outputs_parameter_counts_and_steps_as_libmtl(name, arch, options, kwargs, backbone, shape):
    torch.manual_seed(0)
    model = ours(backbone, shape, arch, **options)
    make = (lambda: TinyResNet.make(shape[0])) if backbone is TinyResNet else (lambda: MLP(shape, {}).trunk)
    if name == "DSelect_k":
        kwargs = {**kwargs, "kgamma": 1.0}
    ref = theirs(name, model, make, shape, **kwargs)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    assert sorted(their_name(name, k) for k in model.state_dict()) == sorted(ref.state_dict())
    copy_into_theirs(name, model, ref)
    shared_ref = {id(p) for p in ref.get_share_params()}
    theirs_by_name = dict(ref.named_parameters())
    shared_names = {n for n, p in model.named_parameters() if id(p) in {id(q) for q in model.shared_parameters()}}
    assert {their_name(name, n) for n in shared_names} == {n for n, p in theirs_by_name.items() if id(p) in shared_ref}

    x = torch.randn(3, 6, *shape, generator=torch.Generator().manual_seed(1))
    y = {t: torch.randn(3, 6, OUT[t], generator=torch.Generator().manual_seed(2 + i)) for i, t in enumerate(TASKS)}
    model.eval(), ref.eval()
    with torch.no_grad():
        mine, reference = model(x[0]).preds, ref(x[0])
    for t in TASKS:
        torch.testing.assert_close(mine[t], reference[t], rtol=1e-5, atol=1e-6)
    model.train(), ref.train()
    sgd_steps(lambda xb: model(xb).preds, list(model.parameters()), 3, x, y)
    sgd_steps(ref, list(ref.parameters()), 3, x, y)
    after = dict(ref.state_dict())
    for key, value in model.state_dict().items():
        if name == "DSelect_k" and key.startswith("trunk._z_logits.a."):
            continue  # LibMTL regularises the last task's gate only (see the test below)
        torch.testing.assert_close(value, after[their_name(name, key)], rtol=1e-4, atol=1e-5, msg=key)


def test_dselect_k_regularises_every_tasks_gate_where_libmtl_regularises_the_last():
    """3 experts (not a power of 2): the regulariser sum 1/(selector mass) is large. After one SGD step on the same
    losses, task b's gate (LibMTL's last) is the same; task a's differs from LibMTL's by lr * the regulariser's
    gradient at task a's gate, computed here from the paper's formula."""
    torch.manual_seed(0)
    shape = (5,)
    model = ours(MLP, shape, DSelectK, num_experts=3, num_nonzeros=2)
    ref = theirs("DSelect_k", model, lambda: MLP(shape, {}).trunk, shape, num_experts=[3], num_nonzeros=2, kgamma=1.0)
    copy_into_theirs("DSelect_k", model, ref)
    gate = model.trunk._z_logits["a"]
    before = [p.detach().clone() for p in gate.parameters()]
    x, y = torch.randn(1, 4, 5), {t: torch.randn(1, 4, OUT[t]) for t in TASKS}
    # The regulariser of task a's selectors at the starting parameters, by the formula.
    logits = gate(x[0]).reshape(4, 2, 1, 2)
    s = torch.clamp((-2) * logits**3 + 1.5 * logits + 0.5, 0, 1)
    codes = torch.tensor([[False, False], [False, True], [True, False]])
    selectors = torch.where(codes, s, 1 - s).prod(3)
    reg = -(selectors * torch.log(selectors + 1e-6)).sum() * 1e-6 + (1 / selectors.sum(-1)).sum()
    reg_grads = torch.autograd.grad(reg, list(gate.parameters()))
    model.train(), ref.train()
    sgd_steps(lambda xb: model(xb).preds, list(model.parameters()), 1, x, y)
    sgd_steps(ref, list(ref.parameters()), 1, x, y)
    for key in ("weight", "bias"):
        torch.testing.assert_close(model.trunk._z_logits["b"].state_dict()[key], ref._z_logits["b"].state_dict()[key])
    their_a = [ref._z_logits["a"].weight, ref._z_logits["a"].bias]
    for ours_p, their_p, g, start in zip(gate.parameters(), their_a, reg_grads, before):
        assert not torch.allclose(ours_p, their_p)
        torch.testing.assert_close(ours_p - their_p, -0.1 * g, rtol=1e-4, atol=1e-6)
        assert not torch.equal(ours_p, start)


def test_paper_cross_stitch_units_mix_each_column_by_its_row():
    """Two stages, two tasks: stage-2 input of column t is sum_j a[t, j] x_j (x_j: column j's stage-1 output)."""
    torch.manual_seed(0)
    model = ours(MLP, (3,), CrossStitch, self_weight=0.75)
    units = model.trunk.cross_unit
    assert units.shape == (3, 2, 2)  # 4 stages (widths), 3 stitches
    torch.testing.assert_close(units[0], torch.tensor([[0.75, 0.25], [0.25, 0.75]]))
    with torch.no_grad():
        units.copy_(torch.tensor([[[0.6, 0.4], [-0.2, 1.1]]] * 3))
    x = torch.randn(4, 3)
    columns = model.trunk.columns
    h = [columns[t][0](x) for t in range(2)]
    for s in range(1, 4):
        h = [columns[t][s](0.6 * h[0] + 0.4 * h[1] if t == 0 else -0.2 * h[0] + 1.1 * h[1]) for t in range(2)]
    out = model(x)
    torch.testing.assert_close(out.preds["a"], model.heads["a"](h[0]))
    torch.testing.assert_close(out.preds["b"], model.heads["b"](h[1]))
    torch.testing.assert_close(out.shared, torch.stack(h))
    assert model.shared_rep_problem() is not None  # each task reads its own column
    measured = model.measurements()
    assert set(measured) == {f"arch/stitch{s}/{t}/{j}" for s in range(3) for t in TASKS for j in TASKS}
    assert measured["arch/stitch1/b/a"].item() == pytest.approx(-0.2)


@pytest.mark.parametrize("mixing", ["paper", "libmtl"])
def test_cross_stitch_logs_the_units_of_the_forward_not_after_the_optimizer_step(mixing):
    """The loop reads measurements after the optimizer step: they must be the forward's values, as the other
    architectures' (a view of the parameter would read the stepped values)."""
    torch.manual_seed(0)
    model = ours(MLP, (3,), CrossStitch, mixing=mixing)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    out = model(torch.randn(4, 3))
    before = {k: v.clone() for k, v in model.measurements().items()}
    sum(p.sum() for p in out.preds.values()).backward()
    optimizer.step()
    assert model.trunk.cross_unit.grad.abs().sum() > 0
    measured = model.measurements()
    assert all(torch.equal(measured[k], before[k]) for k in before)
    model(torch.randn(4, 3))
    assert any(not torch.equal(model.measurements()[k], before[k]) for k in before)  # the next forward's


def test_mmoe_measures_each_tasks_mean_gate_weights_and_mixes_by_them():
    torch.manual_seed(0)
    model = ours(MLP, (3,), MMoE, num_experts=3)
    x = torch.randn(5, 3)
    out = model(x)
    experts = torch.stack([e(x) for e in model.trunk.experts_shared])
    torch.testing.assert_close(out.shared, experts)
    gate = torch.softmax(model.trunk.gate_specific["b"][0](x), dim=-1)
    torch.testing.assert_close(model.heads["b"](sum(gate[:, e, None] * experts[e] for e in range(3))), out.preds["b"])
    measured = model.measurements()
    torch.testing.assert_close(torch.stack([measured[f"arch/gate/b/expert{e}"] for e in range(3)]), gate.mean(0))
    assert model.shared_rep_problem() is None
    model.eval()
    with torch.no_grad():
        model(x * 2)  # evaluation forwards are not measured
    assert model.measurements()["arch/gate/b/expert0"] == measured["arch/gate/b/expert0"]


@pytest.mark.parametrize(
    ("cls", "shape", "stages"),
    [
        (MLP, (5,), [3, 5, 7, 9]),
        (LeNet, (1, 8, 12), [3, 6, 9]),
        (CelebACNN, (3, 16, 16), [4, 11, 18, 26, 32]),
        (ResNet18, (3, 16, 16), [5, 6, 7, 14]),
        (ResNetDilated, (3, 16, 16), [5, 6, 7, 8]),
    ],
)
def test_every_backbone_declares_stages_that_compose_to_its_trunk(cls, shape, stages):
    seen = {}

    def spy(backbone):
        seen["backbone"] = backbone
        return HPS(backbone)

    model = cls(shape, {"a": 1}, arch=spy)
    backbone = seen["backbone"]
    assert list(backbone.stages) == stages
    assert backbone.stem == (4 if cls in (ResNet18, ResNetDilated) else 0)  # conv1, bn1, relu, maxpool
    assert len(backbone.levels(model.trunk)) == len(stages) + (backbone.stem > 0)
    assert backbone.last_layer(model.trunk) is model.last_shared_layer
    model.eval()
    x = torch.randn(2, *shape)
    h = x
    for stage in backbone.cut(model.trunk):
        h = stage(h)
    torch.testing.assert_close(h, model(x).shared)
    fresh = backbone.make_trunk()
    assert [n for n, _ in fresh.named_parameters()] == [n for n, _ in model.trunk.named_parameters()]
    assert not torch.equal(next(fresh.parameters()), next(model.trunk.parameters()))  # its own initialisation


def test_hps_keeps_the_trunk_and_its_parameter_names():
    torch.manual_seed(0)
    plain = MLP((5,), OUT)
    torch.manual_seed(0)
    wrapped = MLP((5,), OUT, arch=HPS)
    assert wrapped.trunk.__class__ is nn.Sequential and wrapped.last_shared_layer is wrapped.trunk[-2]
    assert list(plain.state_dict()) == list(wrapped.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), wrapped.state_dict().values()))


@pytest.mark.parametrize("path", sorted((conf_root() / "model" / "arch").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_arch_yaml_names_each_option_of_its_class(path):
    node = OmegaConf.to_container(OmegaConf.load(path))
    target = check_part(f"model.arch ({path.name})", node, supplied=("backbone",))
    options = {n for n in parameters(target) if n != "backbone"}
    assert options == set(node) - {"_target_", "_partial_"}
    assert path.read_text().startswith("# mtl-bench train ")


@pytest.mark.parametrize(
    ("arch", "options", "message"),
    [
        (MMoE, {"num_experts": 0}, "num_experts: must be an integer >= 1, got 0"),
        (CGC, {"num_specific": -1}, "num_specific: must be an integer >= 0, got -1"),
        (DSelectK, {"num_experts": 1}, "num_experts: must be an integer >= 2, got 1"),
        (DSelectK, {"gamma": 0.0}, "gamma: must be > 0, got 0.0"),
        (CrossStitch, {"mixing": "sum"}, "mixing: 'sum' is not one of paper, libmtl"),
        (CrossStitch, {"self_weight": 1.5}, "self_weight: must be in [0, 1], got 1.5"),
    ],
)
def test_bad_options_name_the_option(arch, options, message):
    with pytest.raises(ValueError) as info:
        ours(MLP, (3,), arch, **options)
    assert str(info.value) == f"arch.{message}"  # the model names the key under itself: model.arch.<option>


def test_a_model_without_stages_refuses_an_architecture():
    trunk = nn.Sequential(nn.Linear(3, 4))
    with pytest.raises(ValueError, match="^arch: MultiTaskModel declares no stages, so only hps wraps it$"):
        MultiTaskModel(trunk, {"a": nn.Linear(4, 1)}, trunk[0], arch=MMoE)


def test_a_bad_architecture_option_is_one_line_naming_its_config_key(compose_cfg):
    cfg = compose_cfg("model=mlp", "model/arch=mmoe", "model.arch.num_experts=0")
    with pytest.raises(ConfigError) as info:
        build("model", cfg.model, MultiTaskModel, input_shape=(3,), heads=OUT)
    assert str(info.value) == "model.arch.num_experts: must be an integer >= 1, got 0"


class ResNet18Maps(MultiTaskModel):
    """torchvision's ResNet-18 up to layer4 (feature maps), pooled by the heads: the ResNet LibMTL's MTAN takes."""

    def __init__(self, input_shape: Sequence[int], heads: Mapping[str, int], arch: Any = None) -> None:
        trunk = self.make()
        task_heads = {
            t: nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, n)) for t, n in heads.items()
        }
        super().__init__(
            trunk,
            task_heads,
            trunk.layer4[-1].conv2,
            stages=(5, 6, 7, 8),
            stem=4,
            make_trunk=self.make,
            input_shape=input_shape,
            arch=arch,
        )

    @staticmethod
    def make() -> nn.Sequential:
        net = torchvision.models.resnet18(weights=None)
        names = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")
        return nn.Sequential(OrderedDict((n, getattr(net, n)) for n in names))


def test_mtan_same_outputs_parameter_counts_and_steps_as_libmtl(monkeypatch):
    """LibMTL's MTAN on the same ResNet-18 trunk. Its attention blocks come from LibMTL/model/resnet.py, which
    imports a torchvision module that no longer exists (torchvision.models.utils): a stand-in gives it torch.hub's
    function of the same name."""
    utils = types.ModuleType("torchvision.models.utils")
    utils.load_state_dict_from_url = torch.hub.load_state_dict_from_url  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchvision.models.utils", utils)
    libmtl_module("resnet", package="model", needs=())
    module = libmtl_module("MTAN", package="architecture", needs=("abstract_arch",))
    torch.manual_seed(0)
    model = ResNet18Maps((3, 16, 16), OUT, arch=MTAN)

    def encoder() -> nn.Sequential:
        trunk = ResNet18Maps.make()
        trunk.feature_dim = 512  # what LibMTL's MTAN reads to tell BasicBlock ResNets from Bottleneck ones
        return trunk

    decoders = nn.ModuleDict({t: copy.deepcopy(model.heads[t]) for t in TASKS})
    ref = module.MTAN(list(TASKS), encoder, decoders, False, False, torch.device("cpu"))
    stem = {"conv1": "0", "bn1": "1"}

    def name(ours_name: str) -> str:
        ours_name = re.sub(r"^heads\.", "decoders.", ours_name)
        ours_name = re.sub(r"^trunk\.", "encoder.", ours_name)
        match = re.match(r"encoder\.shared_conv\.(\w+)\.(.*)", ours_name)
        return f"encoder.shared_conv.{stem[match.group(1)]}.{match.group(2)}" if match else ours_name

    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    assert sorted(name(k) for k in model.state_dict()) == sorted(ref.state_dict())
    ref.load_state_dict({name(k): v for k, v in model.state_dict().items()})
    theirs_shared = {n for n, p in ref.named_parameters() if id(p) in {id(q) for q in ref.get_share_params()}}
    ours_shared = {name(n) for n, p in model.named_parameters() if id(p) in {id(q) for q in model.shared_parameters()}}
    assert ours_shared - theirs_shared == {n for n in ours_shared if n.startswith("encoder.encoder_block_att.")}
    assert theirs_shared <= ours_shared

    x = torch.randn(3, 4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    y = {t: torch.randn(3, 4, OUT[t], generator=torch.Generator().manual_seed(2 + i)) for i, t in enumerate(TASKS)}
    model.eval(), ref.eval()
    with torch.no_grad():
        mine, reference = model(x[0]).preds, ref(x[0])
    for t in TASKS:
        torch.testing.assert_close(mine[t], reference[t], rtol=1e-5, atol=1e-6)
    model.train(), ref.train()
    sgd_steps(lambda xb: model(xb).preds, list(model.parameters()), 3, x, y)
    sgd_steps(ref, list(ref.parameters()), 3, x, y)
    after = dict(ref.state_dict())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, after[name(key)], rtol=1e-4, atol=1e-5, msg=key)


def test_mtan_refuses_a_backbone_whose_stages_do_not_end_in_feature_maps():
    with pytest.raises(
        ValueError, match="^arch.backbone: mtan needs stages ending in feature maps, stage 0 gives 2-d$"
    ):
        MLP((4,), OUT, arch=MTAN)
    with pytest.raises(
        ValueError, match="^arch.backbone: mtan needs stages ending in feature maps, stage 3 gives 2-d$"
    ):
        ResNet18((3, 16, 16), OUT, arch=MTAN)  # its last stage ends in the pooled hidden layer


# LibMTL's LTB (github.com/median-research-group/LibMTL, main branch at 4336804, LibMTL/architecture/LTB.py; not in
# the 1.1.5 release) on the same TinyResNet columns, parameters copied from ours (built after torch.manual_seed(0)),
# three SGD steps (lr 0.1, the two MSE losses summed) at epochs 0 (warm-up), 5 and 30 of 100, torch.manual_seed(100 +
# step) before each forward: its predictions and its `alpha` afterwards, rounded to 6 decimals. Ours matched it to
# 0.0 when these were taken.
LTB_PREDS = {
    (0, "a"): [-0.251166, -0.224512, -0.105322, -0.272936, -0.211384, -0.190412]
    + [-0.166736, -0.211191, -0.124773, -0.301507, -0.263232, -0.22089],
    (5, "b"): [-0.047974, 0.174403, 0.110312, -0.109484, 0.233416, 0.112904, 0.022644, 0.272923, 0.115616]
    + [-0.0811, 0.121831, -0.00167, -0.013439, 0.122015, -0.003252, 0.109874, 0.176038, -0.125442],
    (30, "a"): [-0.380997, -0.187129, -0.493391, -0.138203, -0.329026, -0.123494]
    + [-0.411223, -0.138156, -0.39729, -0.155685, -0.465061, -0.278325],
}
LTB_ALPHA = [1.0, 1.0, 1.0, 1.0, 0.999211, 1.000789, 1.0, 1.0, 0.996383, 1.003617, 1.0, 1.0, 1.002267, 0.997733]
LTB_ALPHA += [0.999786, 1.000214, 1.000672, 0.999328, 0.997859, 1.002141, 1.0, 1.0, 1.0, 1.0]


def test_ltb_matches_libmtl_main_branch_numbers():
    torch.manual_seed(0)
    model = TinyResNet((3, 8, 8), OUT, arch=LTB)
    assert sum(p.numel() for p in model.parameters()) == 3201  # LibMTL's count on the same columns and heads
    x = torch.randn(3, 6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    y = {t: torch.randn(3, 6, OUT[t], generator=torch.Generator().manual_seed(2 + i)) for i, t in enumerate(TASKS)}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for step, epoch in enumerate((0, 5, 30)):
        model.set_progress(epoch, 100)
        torch.manual_seed(100 + step)
        opt.zero_grad()
        preds = model(x[step]).preds
        for (at, task), values in LTB_PREDS.items():
            if at == epoch:
                torch.testing.assert_close(preds[task].flatten(), torch.tensor(values), rtol=0, atol=2e-6)
        sum(F.mse_loss(preds[t], y[t][step]) for t in TASKS).backward()
        opt.step()
    torch.testing.assert_close(model.trunk.alpha.flatten(), torch.tensor(LTB_ALPHA), rtol=0, atol=2e-6)
    assert set(model.measurements()) == {f"arch/branch{i}/{t}/{j}" for i in range(1, 5) for t in TASKS for j in TASKS}


def test_ltb_evaluates_with_each_tasks_most_likely_parent_and_needs_the_progress_to_train():
    torch.manual_seed(0)
    model = TinyResNet((3, 8, 8), OUT, arch=LTB)
    with torch.no_grad():
        model.trunk.alpha.copy_(torch.tensor([[0.0, 1.0], [2.0, -1.0]]).expand(6, 2, 2))
    model.set_progress(5, 100)  # past the warm-up (the first epoch of 100)
    model.eval()
    a = model.trunk.branching()
    torch.testing.assert_close(a[1], torch.tensor([[0.0, 1.0], [1.0, 0.0]]))  # a reads b's column, b reads a's
    model.train()
    model.trunk.epoch = model.trunk.epochs = None
    with pytest.raises(RuntimeError, match=r"model.set_progress\(epoch, epochs\)"):
        model(torch.randn(2, 3, 8, 8))


@pytest.mark.parametrize("progress", [None, (0, 1), (0, 50), (1, 200)])
def test_ltb_evaluates_the_network_it_trains_during_the_warm_up(progress):
    """In the warm-up training sums every column; evaluation must too (alpha gets no gradient then, so its argmax
    picks column 0 for every task: a network never trained). A run of one epoch or less is all warm-up."""
    torch.manual_seed(0)
    model = TinyResNet((3, 8, 8), OUT, arch=LTB)
    model.trunk.alpha.data[..., 0] += 0.5  # an argmax that is not a tie
    if progress is not None:
        model.set_progress(*progress)
    x = torch.randn(3, 3, 8, 8)
    model.eval()
    with torch.no_grad():
        evaluated = model(x)
        a = model.trunk.branching()
        assert torch.equal(a, torch.ones_like(a))
        model.trunk.alpha.data.normal_()  # the warm-up network does not depend on alpha
        again = model(x)
    for task in TASKS:
        torch.testing.assert_close(evaluated.preds[task], again.preds[task], rtol=0, atol=0)
    if progress is not None:
        model.train()
        trained = model.trunk.branching()
        assert torch.equal(trained, a)  # the one network both use


def test_ltb_after_the_warm_up_evaluates_one_parent_per_task():
    model = TinyResNet((3, 8, 8), OUT, arch=LTB)
    model.set_progress(1, 100)
    model.eval()
    a = model.trunk.branching()
    assert torch.equal(a.sum(-1), torch.ones(a.shape[:-1]))  # one parent each
