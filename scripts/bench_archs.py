"""Parameter count and training-step time of each architecture against LibMTL 1.1.5's same architecture, one run.

    python scripts/bench_archs.py [--rounds 5] [--steps 3] [--batch 16] [--size 32] [--device cpu] [--threads 1]
    python scripts/bench_archs.py --backbone resnet_dilated --archs hps,mtan,cross_stitch,ple --batch 4

Backbone: ResNet-18 (mtl_bench.models.ResNet18: torchvision's ResNet-18, pooled hidden layer of 512 + BatchNorm +
ReLU + dropout) on (3, size, size) images, two tasks with linear heads (10 and 5 classes). LibMTL's architectures
(loaded from the installed files) get the same trunk as their encoder, cut where ours cuts it (conv1, bn1, relu,
maxpool, layer1..3, and layer4 followed by the pooled hidden layer), and copies of our heads as decoders: the same
shapes and operations on both sides (tests/models/test_archs.py checks the numbers are the same). A step:
zero_grad, forward, the two cross-entropy losses summed (equal weights), backward, SGD step. Ours and LibMTL's
run interleaved round after round, who goes first alternating; each time is the median over rounds of the mean
step time over --steps steps. Prints a markdown table.

--backbone resnet_dilated: dilated ResNet-50 with its DeepLab heads (3 and 1 channels, MSE against random maps);
LibMTL's encoder is the same trunk (conv1 .. layer4, `feature_dim` 2048, what its MTAN reads). MTAN runs on this
backbone only (ResNet-18's last stage ends in vectors); LibMTL's MTAN imports LibMTL/model/resnet.py, whose
torchvision import no longer exists: a stand-in module gives it torch.hub's function of the same name.
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import sys
import time
import types
from collections import OrderedDict
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.peers import libmtl_module, restore_dselect_k_codes
from mtl_bench.analysis.machine import machine_description
from mtl_bench.models import ResNet18, ResNetDilated
from mtl_bench.models.archs import CGC, HPS, MTAN, PLE, CrossStitch, DSelectK, MMoE

TASKS = {"a": 10, "b": 5}  # classes (resnet18) or channels (resnet_dilated: 3 and 1)
DENSE = {"a": 3, "b": 1}
# name: (our class, our options, LibMTL's class name, LibMTL's options)
ARCHS: dict[str, tuple[Callable[..., Any], dict[str, Any], str, dict[str, Any]]] = {
    "hps": (HPS, {}, "HPS", {}),
    "mmoe": (MMoE, {"num_experts": 4}, "MMoE", {"num_experts": [4]}),
    "cgc": (CGC, {"num_shared": 1, "num_specific": 1}, "CGC", {"num_experts": [1, 1, 1]}),
    "ple": (PLE, {"num_shared": 1, "num_specific": 1}, "PLE", {"num_experts": [1, 1, 1]}),
    "dselect_k": (DSelectK, {"num_experts": 4}, "DSelect_k", {"num_experts": [4], "num_nonzeros": 2, "kgamma": 1.0}),
    "cross_stitch": (CrossStitch, {"mixing": "libmtl"}, "Cross_stitch", {}),
    "mtan": (MTAN, {}, "MTAN", {}),
}
NEEDS = {"MMoE": ("abstract_arch",), "CGC": ("abstract_arch", "MMoE"), "DSelect_k": ("abstract_arch", "MMoE")}


def libmtl_encoder(trunk: nn.Sequential) -> nn.Sequential:
    """Our ResNet-18 trunk under LibMTL's attribute names: its layer4 is our last stage (layer4 + pooled hidden)."""
    names = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3")
    parts = [(n, trunk.get_submodule(n)) for n in names]
    return nn.Sequential(OrderedDict([*parts, ("layer4", trunk[7:])]))


def dilated_encoder(shape: tuple[int, ...]) -> nn.Sequential:
    trunk = ResNetDilated(shape, {}).trunk
    trunk.feature_dim = 2048  # what LibMTL's MTAN reads to pick Bottleneck blocks
    return trunk


def build(name: str, shape: tuple[int, ...], device: torch.device, backbone: str) -> tuple[nn.Module, nn.Module]:
    cls, options, their_cls, their_options = ARCHS[name]
    torch.manual_seed(0)
    if their_cls == "MTAN":
        utils = types.ModuleType("torchvision.models.utils")
        utils.load_state_dict_from_url = torch.hub.load_state_dict_from_url  # type: ignore[attr-defined]
        sys.modules.setdefault("torchvision.models.utils", utils)
        libmtl_module("resnet", package="model", needs=())
    make: Callable[[], nn.Sequential]
    if backbone == "resnet_dilated":
        ours = ResNetDilated(shape, DENSE, arch=lambda backbone: cls(backbone, **options)).to(device)
        make = lambda: dilated_encoder(shape)  # noqa: E731
    else:
        ours = ResNet18(shape, TASKS, arch=lambda backbone: cls(backbone, **options)).to(device)
        make = lambda: libmtl_encoder(ResNet18(shape, {}).trunk)  # noqa: E731
    module = libmtl_module(their_cls, package="architecture", needs=NEEDS.get(their_cls, ("abstract_arch",)))
    decoders = nn.ModuleDict({t: copy.deepcopy(ours.heads[t]) for t in TASKS})

    ref = getattr(module, their_cls)(
        list(TASKS), make, decoders, False, False, device, img_size=list(shape), **their_options
    ).to(device)
    if their_cls == "DSelect_k":
        restore_dselect_k_codes(ref)
    return ours, ref


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def timer(model: nn.Module, predict: Callable, x: torch.Tensor, y: dict, steps: int, device: torch.device) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        preds = predict(x)
        loss = F.mse_loss if y["a"].is_floating_point() else F.cross_entropy
        sum(loss(preds[t], y[t]) for t in TASKS).backward()
        opt.step()

    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--archs", default=",".join(a for a in ARCHS if a != "mtan"))
    parser.add_argument("--backbone", default="resnet18", choices=("resnet18", "resnet_dilated"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("mtl_bench").setLevel(logging.ERROR)  # the random-initialisation notice, once per trunk
    device = torch.device(args.device)
    shape = (3, args.size, args.size)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, *shape, generator=gen).to(device)
    if args.backbone == "resnet_dilated":
        y = {t: torch.randn(args.batch, c, *shape[1:], generator=gen).to(device) for t, c in DENSE.items()}
    else:
        y = {t: torch.randint(0, n, (args.batch,), generator=gen).to(device) for t, n in TASKS.items()}
    print(f"Machine: {machine_description()}; device {device}, {args.threads} thread(s)")
    tasks = DENSE if args.backbone == "resnet_dilated" else TASKS
    print(f"{args.backbone} backbone, input {shape}, batch {args.batch}, tasks {tasks}, {args.rounds} x {args.steps}")
    print()
    print("| arch | params (ours) | params (LibMTL) | step ms (ours) | step ms (LibMTL) | ours / LibMTL |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.archs.split(","):
        ours, ref = build(name, shape, device, args.backbone)
        mine, theirs = [], []
        for r in range(args.rounds):  # who goes first alternates: the second of a pair ran faster here
            if r % 2:
                theirs.append(timer(ref, ref, x, y, args.steps, device))
            mine.append(timer(ours, lambda b: ours(b).preds, x, y, args.steps, device))
            if not r % 2:
                theirs.append(timer(ref, ref, x, y, args.steps, device))
        a, b = statistics.median(mine) * 1e3, statistics.median(theirs) * 1e3
        print(f"| {name} | {count(ours):,} | {count(ref):,} | {a:.1f} | {b:.1f} | {a / b:.3f} |", flush=True)


if __name__ == "__main__":
    main()
