"""resnet_dilated and resnet18 against LibMTL (median-research-group/LibMTL 4336804, installed as LibMTL 1.1.5):
parameter counts, the forward on the same weights (LibMTL's encoders loaded from the installed files, its example-only
heads rebuilt below from their source), `model.weights` (a local torchvision state dict) and the
nyuv2_resnet_dilated preset."""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchvision
from omegaconf import OmegaConf
from torch import Tensor, nn

from mtl_bench.models.resnet18 import ResNet18
from mtl_bench.models.resnet_dilated import ResNetDilated
from mtl_bench.optim.schedules import to_steps
from tests.helpers.balancer_kit import libmtl_module

NYU = {"segmentation": 13, "depth": 1, "normal": 3}
OFFICE31 = {"amazon": 31, "dslr": 31, "webcam": 31}


def n_params(params) -> int:
    return sum(p.numel() for p in params)


# ------------------------------------------------------------------------------------------------ the reference


@contextlib.contextmanager
def _old_torchvision_utils():
    """LibMTL 1.1.5's resnet.py imports `torchvision.models.utils.load_state_dict_from_url` (gone from torchvision;
    the reference's HEAD falls back to torch.hub's, the same function): provide it while its files load."""
    had = "torchvision.models.utils" in sys.modules
    if not had:
        stub = types.ModuleType("torchvision.models.utils")
        stub.load_state_dict_from_url = torch.hub.load_state_dict_from_url  # type: ignore[attr-defined]
        sys.modules["torchvision.models.utils"] = stub
    try:
        yield
    finally:
        if not had:
            del sys.modules["torchvision.models.utils"]


def libmtl_model(name: str) -> types.ModuleType:
    """A module of LibMTL's `model` package from its installed file (balancer_kit.libmtl_module); its files
    import torchvision.models.utils, which current torchvision no longer has."""
    with _old_torchvision_utils():
        return libmtl_module(name, package="model", needs=("resnet",))  # resnet_dilated imports LibMTL.model.resnet


# LibMTL 4336804 examples/nyu/aspp.py (not part of the installed package), rebuilt from its source.
class RefASPPConv(nn.Sequential):
    def __init__(self, in_channels, out_channels, dilation):
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 3, padding=dilation, dilation=dilation, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        )


class RefASPPPooling(nn.Sequential):
    def __init__(self, in_channels, out_channels):
        super().__init__(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(in_channels, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        )

    def forward(self, x):
        size = x.shape[-2:]
        x = super().forward(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class RefASPP(nn.Module):
    def __init__(self, in_channels, atrous_rates):
        super().__init__()
        out_channels = 256
        modules = [
            nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU())
        ]
        rate1, rate2, rate3 = tuple(atrous_rates)
        modules += [RefASPPConv(in_channels, out_channels, r) for r in (rate1, rate2, rate3)]
        modules.append(RefASPPPooling(in_channels, out_channels))
        self.convs = nn.ModuleList(modules)
        self.project = nn.Sequential(
            nn.Conv2d(5 * out_channels, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
            nn.Dropout(0.5),
        )

    def forward(self, x):
        return self.project(torch.cat([conv(x) for conv in self.convs], dim=1))


class RefDeepLabHead(nn.Sequential):
    def __init__(self, in_channels, num_classes):
        super().__init__(
            RefASPP(in_channels, [12, 24, 36]),
            nn.Conv2d(256, 256, 3, padding=1, bias=False),
            nn.BatchNorm2d(256),
            nn.ReLU(),
            nn.Conv2d(256, num_classes, 1),
        )


class RefNYU(nn.Module):
    """examples/nyu/main.py with LibMTL's HPS: encoder `resnet_dilated('resnet50')`, decoders `DeepLabHead(2048, C)`,
    the trainer's `process_preds` (bilinear, align_corners=True, to the image size); normals as its loss and metric
    see them (`pred / torch.norm(pred, p=2, dim=1, keepdim=True)`, examples/nyu/utils.py)."""

    def __init__(self, heads: dict[str, int], dilate_scale: int = 8, normalize: bool = True):
        super().__init__()
        self.normalize = normalize
        self.encoder = libmtl_model("resnet_dilated").resnet_dilated(
            "resnet50", pretrained=False, dilate_scale=dilate_scale
        )
        self.decoders = nn.ModuleDict({task: RefDeepLabHead(2048, out) for task, out in heads.items()})

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        rep = self.encoder(x)
        preds = {
            task: F.interpolate(dec(rep), x.shape[-2:], mode="bilinear", align_corners=True)
            for task, dec in self.decoders.items()
        }
        if "normal" in preds and self.normalize:
            preds["normal"] = preds["normal"] / torch.norm(preds["normal"], p=2, dim=1, keepdim=True)
        return preds


class RefOffice(nn.Module):
    """examples/office/main.py: `Encoder` (LibMTL's resnet18, avgpool, flatten, Linear(512, 512) + BatchNorm1d + ReLU
    + Dropout(0.5)) and `decoders` (Linear(512, classes) per task)."""

    def __init__(self, heads: dict[str, int]):
        super().__init__()
        self.resnet_network = libmtl_model("resnet").resnet18(pretrained=False)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.hidden_layer = nn.Sequential(nn.Linear(512, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Dropout(0.5))
        self.decoders = nn.ModuleDict({task: nn.Linear(512, out) for task, out in heads.items()})

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        rep = self.hidden_layer(torch.flatten(self.avgpool(self.resnet_network(x)), 1))
        return {task: dec(rep) for task, dec in self.decoders.items()}


def copy_into_reference(model: nn.Module, ref: nn.Module) -> None:
    """Our parameters and buffers into the reference, in order (the module orders are the same), shapes checked."""
    ours, theirs = model.state_dict(), ref.state_dict()
    assert len(ours) == len(theirs)
    mapped = {}
    for (key, value), (ref_key, ref_value) in zip(ours.items(), theirs.items()):
        assert key.rsplit(".", 1)[-1] == ref_key.rsplit(".", 1)[-1] and value.shape == ref_value.shape, (key, ref_key)
        mapped[ref_key] = value
    ref.load_state_dict(mapped)


def assert_same_predictions(model: nn.Module, ref: nn.Module, x: Tensor) -> None:
    for train_mode in (False, True):  # eval: running statistics, no dropout; train: batch statistics, dropout
        model.train(train_mode)
        ref.train(train_mode)
        with torch.no_grad():
            torch.manual_seed(1)
            ours = model(x).preds
            torch.manual_seed(1)
            theirs = ref(x)
        assert list(ours) == list(theirs)
        for task in ours:
            torch.testing.assert_close(ours[task], theirs[task], rtol=1e-5, atol=1e-5, msg=f"{task} train={train_mode}")


# ------------------------------------------------------------------------------------------------ parameter counts


# From the reference's code: sum(p.numel()) of resnet_dilated('resnet50') (LibMTL/model/resnet_dilated.py) = 23,508,032;
# of DeepLabHead(2048, C) (examples/nyu/aspp.py) = 16,125,440 + 257 C; of examples/office/main.py's Encoder
# = 11,176,512 (resnet18) + 262,656 (Linear 512x512) + 1,024 (BatchNorm1d) and its decoders 513 C each.
@pytest.mark.parametrize(
    ("shape", "heads", "total"),
    [
        ((3, 288, 384), NYU, 23_508_032 + 3 * 16_125_440 + 257 * 17),  # NYUv2: 71,888,721
        ((3, 128, 256), {"segmentation": 7, "depth": 1}, 23_508_032 + 2 * 16_125_440 + 257 * 8),  # Cityscapes
    ],
)
def test_resnet_dilated_parameter_counts_match_libmtl(shape, heads, total):
    model = ResNetDilated(shape, heads)
    assert n_params(model.parameters()) == total
    assert n_params(model.shared_parameters()) == 23_508_032
    for task, out in heads.items():
        assert n_params(model.task_parameters(task)) == 16_125_440 + 257 * out


@pytest.mark.parametrize(
    ("heads", "total"),
    [
        (OFFICE31, 11_176_512 + 262_656 + 1_024 + 3 * 513 * 31),  # Office-31: 11,487,901
        ({"Art": 65, "Clipart": 65, "Product": 65, "Real_World": 65}, 11_440_192 + 4 * 513 * 65),  # Office-Home
    ],
)
def test_resnet18_parameter_counts_match_libmtl(heads, total):
    model = ResNet18((3, 224, 224), heads)
    assert n_params(model.parameters()) == total
    assert n_params(model.shared_parameters()) == 11_440_192


def test_the_counts_above_are_what_libmtls_modules_give():
    encoder = libmtl_model("resnet_dilated").resnet_dilated("resnet50", pretrained=False)
    assert n_params(encoder.parameters()) == 23_508_032
    assert n_params(RefDeepLabHead(2048, 13).parameters()) == 16_125_440 + 257 * 13
    office = RefOffice(OFFICE31)
    assert n_params(office.parameters()) - n_params(office.decoders.parameters()) == 11_440_192


# ------------------------------------------------------------------------------------------------ the forward


@pytest.mark.parametrize("output_stride", [8, 16])
def test_resnet_dilated_forward_equals_libmtls_on_the_same_weights(output_stride):
    torch.manual_seed(0)
    # output stride 16: one head, its normals left raw (LibMTL's model output, before its loss normalises them)
    heads, normalize = (NYU, ["normal"]) if output_stride == 8 else ({"normal": 3}, [])
    model = ResNetDilated((3, 32, 48), heads, output_stride=output_stride, normalize=normalize)
    ref = RefNYU(heads, dilate_scale=output_stride, normalize=bool(normalize))
    copy_into_reference(model, ref)
    assert list(model.trunk.state_dict()) == list(ref.encoder.state_dict())  # LibMTL's encoder's parameter names
    x = torch.randn(2, 3, 32, 48)
    assert_same_predictions(model, ref, x)
    out = model(x)
    assert out.shared.shape == (2, 2048, 32 // output_stride, 48 // output_stride)
    assert ((out.preds["normal"].norm(dim=1) - 1).abs().max() < 1e-5) == bool(normalize)


def test_resnet18_forward_equals_libmtls_office_model_on_the_same_weights():
    torch.manual_seed(0)
    model = ResNet18((3, 224, 224), OFFICE31)
    ref = RefOffice(OFFICE31)
    copy_into_reference(model, ref)
    assert_same_predictions(model, ref, torch.randn(3, 3, 48, 48))


def test_resnet18_hidden_layer_starts_as_the_reference():
    torch.manual_seed(0)
    hidden = ResNet18((3, 224, 224), OFFICE31).trunk.hidden
    assert torch.equal(hidden.bias, torch.full((512,), 0.1))
    assert abs(hidden.weight.std().item() - 0.005) < 2e-4 and abs(hidden.weight.mean().item()) < 1e-4


def test_predictions_shapes_and_the_shared_split():
    torch.manual_seed(0)
    model = ResNetDilated((3, 24, 40), NYU)
    out = model(torch.randn(2, 3, 24, 40))
    assert out.shared.shape == (2, 2048, 3, 5)
    assert {t: tuple(p.shape) for t, p in out.preds.items()} == {t: (2, c, 24, 40) for t, c in NYU.items()}
    torch.testing.assert_close(out.preds["normal"].norm(dim=1), torch.ones(2, 24, 40))
    assert model.last_shared_layer is model.trunk.layer4[-1].conv3
    shared = {id(p) for p in model.shared_parameters()}
    assert {id(p) for p in model.last_shared_layer.parameters()} <= shared
    assert all(id(p) not in shared for t in NYU for p in model.task_parameters(t))

    office = ResNet18((3, 224, 224), OFFICE31)
    out = office(torch.randn(2, 3, 32, 32), tasks=["dslr"])
    assert out.shared.shape == (2, 512) and list(out.preds) == ["dslr"] and out.preds["dslr"].shape == (2, 31)
    assert office.last_shared_layer is office.trunk.hidden


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (ResNetDilated, {"input_shape": (1, 32, 32)}, "input_shape: ResNetDilated takes RGB images"),
        (ResNetDilated, {"output_stride": 32}, "output_stride: must be 8 or 16, got 32"),
        (ResNetDilated, {"atrous_rates": [12, 0]}, "atrous_rates: need one or more integer dilations > 0"),
        (ResNetDilated, {"normalize": "normal"}, "normalize: need a list of task names"),
        (ResNet18, {"input_shape": (3, 224)}, "input_shape: ResNet18 needs (channels, height, width)"),
        (ResNet18, {"hidden": 0}, "hidden: must be an integer > 0, got 0"),
        (ResNet18, {"dropout": 1.0}, "dropout: must be in [0, 1), got 1.0"),
    ],
)
def test_bad_options_name_their_argument(cls, kwargs, message):
    args = {"input_shape": (3, 32, 32), "heads": {"a": 2}} | kwargs
    with pytest.raises(ValueError) as info:
        cls(**args)
    assert str(info.value).startswith(message)


# ------------------------------------------------------------------------------------------------ model.weights


@pytest.fixture(scope="module")
def resnet18_file(tmp_path_factory) -> tuple[Path, dict[str, Tensor]]:
    """A torchvision ResNet-18 state dict as torchvision ships it (classifier included), with non-default values."""
    torch.manual_seed(3)
    source = torchvision.models.resnet18(weights=None)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 0.01)
        for m in source.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("weights") / "resnet18-f37072fd.pth"
    state = source.state_dict()
    torch.save(state, path)
    return path, state


def test_weights_load_a_torchvision_state_dict_and_ignore_its_classifier(resnet18_file, caplog):
    path, state = resnet18_file
    with caplog.at_level(logging.INFO, logger="mtl_bench"):
        model = ResNet18((3, 224, 224), OFFICE31, weights=str(path))
    assert not any("random initialisation" in r.getMessage() for r in caplog.records)
    trunk = model.trunk.state_dict()
    for key, value in state.items():
        if key.startswith("fc."):
            assert key not in trunk
        else:
            assert torch.equal(trunk[key], value), key


def test_resnet_dilated_loads_a_resnet50_state_dict(tmp_path):
    torch.manual_seed(4)
    source = torchvision.models.resnet50(weights=None)
    with torch.no_grad():
        source.layer4[2].conv3.weight.mul_(3.0)
    torch.save(source.state_dict(), tmp_path / "resnet50.pth")
    model = ResNetDilated((3, 32, 32), {"depth": 1}, weights=str(tmp_path / "resnet50.pth"))
    assert torch.equal(model.last_shared_layer.weight, source.layer4[2].conv3.weight)
    assert torch.equal(model.trunk.conv1.weight, source.conv1.weight)


def test_without_weights_the_log_says_once_that_published_numbers_are_pretrained(caplog):
    with caplog.at_level(logging.INFO, logger="mtl_bench"):
        ResNet18((3, 224, 224), OFFICE31)
    lines = [r.getMessage() for r in caplog.records if "random initialisation" in r.getMessage()]
    assert len(lines) == 1 and "ImageNet-pretrained" in lines[0] and "resnet18-f37072fd.pth" in lines[0]
    assert caplog.records[0].levelno == logging.WARNING


class NotATensor:
    pass


def test_bad_weight_files_are_one_line_naming_weights_and_the_path(tmp_path, resnet18_file):
    path, state = resnet18_file
    cases = {"missing.pth": "weights: no file at {path}"}
    (tmp_path / "text.pth").write_text("not a torch file")
    cases["text.pth"] = "weights: {path} is not a state dict torch.load reads with weights_only=True ("
    torch.save({"model": NotATensor()}, tmp_path / "pickle.pth")
    cases["pickle.pth"] = "weights: {path} is not a state dict torch.load reads with weights_only=True ("
    torch.save([torch.zeros(2)], tmp_path / "list.pth")
    cases["list.pth"] = "weights: {path} is not a state dict (a mapping of parameter names to tensors), got list"
    partial = {k: v for k, v in state.items() if not k.startswith("layer4.")}
    torch.save(partial | {"extra.weight": torch.zeros(1)}, tmp_path / "partial.pth")
    cases["partial.pth"] = (
        "weights: {path} does not fit torchvision's resnet18: 30 missing keys "
        "(layer4.0.conv1.weight, layer4.0.bn1.weight, layer4.0.bn1.bias, ... (30 in all)); "
        "1 unexpected keys (extra.weight)"
    )
    torch.save(state | {"conv1.weight": torch.zeros(64, 3, 3, 3)}, tmp_path / "shape.pth")
    cases["shape.pth"] = (
        "weights: {path} does not fit torchvision's resnet18: 1 mis-shaped "
        "(conv1.weight (64, 3, 3, 3) for (64, 3, 7, 7))"
    )
    for name, message in cases.items():
        with pytest.raises(ValueError) as info:
            ResNet18((3, 224, 224), OFFICE31, weights=str(tmp_path / name))
        text = str(info.value)
        assert text.startswith(message.format(path=tmp_path / name)), text
        assert "\n" not in text
    with pytest.raises(ValueError, match=r"^weights: .*resnet18-f37072fd.pth does not fit torchvision's resnet50: "):
        ResNetDilated((3, 32, 32), {"depth": 1}, weights=str(path))


# ------------------------------------------------------------------------------------------------ the preset

# LibMTL-recipe NYUv2 STL row as printed (DB-MTL, arXiv:2308.12029; Rep-MTL, arXiv:2507.21049 Table 1):
# mIoU, Pix Acc (%), Abs Err, Rel Err, Mean, Median (degrees), within 11.25, 22.5, 30 (%).
PRINTED_STL = [53.50, 75.39, 0.3926, 0.1605, 21.99, 15.16, 39.04, 65.00, 75.16]


def test_preset_is_libmtls_recipe_with_the_stl_reference(compose_cfg):
    cfg = compose_cfg("experiment=nyuv2_resnet_dilated")
    assert cfg.model._target_.endswith("ResNetDilated") and cfg.model.weights is None
    assert cfg.tasks.error_batch is None and cfg.tasks.augment is False
    assert (cfg.optim.lr, cfg.optim.weight_decay) == (1e-4, 1e-5)
    assert (cfg.trainer.batch_size, cfg.trainer.epochs, cfg.trainer.eval_batch_size) == (8, 200, 8)
    steps_per_epoch = 795 // cfg.trainer.batch_size  # LibMTL's loader drops the last partial batch, as ours
    assert cfg.optim.schedule.step_size == "100 epochs" and cfg.optim.schedule.gamma == 0.5
    assert to_steps("step_size", cfg.optim.schedule.step_size, steps_per_epoch) == 100 * steps_per_epoch
    assert to_steps("trainer.eval_every", cfg.trainer.eval_every, steps_per_epoch) == steps_per_epoch
    ref = OmegaConf.to_container(cfg.tasks.reference)
    ours = [
        ref["segmentation"]["miou"] * 100,
        ref["segmentation"]["pixel_acc"] * 100,
        ref["depth"]["abs_err"],
        ref["depth"]["rel_err"],
        ref["normal"]["angle_mean"],
        ref["normal"]["angle_median"],
        ref["normal"]["within_11_25"] * 100,
        ref["normal"]["within_22_5"] * 100,
        ref["normal"]["within_30"] * 100,
    ]
    assert ours == pytest.approx(PRINTED_STL, abs=1e-9)
    assert sorted(ref["normal"]) == sorted(["angle_mean", "angle_median", "within_11_25", "within_22_5", "within_30"])
