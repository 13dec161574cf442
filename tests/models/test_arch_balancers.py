"""Every balancer (conf/balancer/*.yaml) on every architecture (conf/model/arch/*.yaml), built from config as the
engine builds them, takes two SGD steps on a small MLP backbone; the combinations that make no sense are refused
at build time with one line."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock

from mtl_bench.balancers import BackwardContext, Balancer, needs_validation
from mtl_bench.catalog import config_options
from mtl_bench.config import ENGINE_KEYS
from mtl_bench.engine.builders import build, node_dict, target_of
from mtl_bench.engine.compat import check_model_balancer
from mtl_bench.errors import ConfigError
from mtl_bench.models import MultiTaskModel
from mtl_bench.models.archs import MTAN
from tests.helpers.validation import GivenBatches, model_batches

TASKS = {"a": 2, "b": 1, "c": 3}
ARCHS = [a for a in config_options()["model/arch"] if a != "mtan"]  # mtan needs feature maps: see test_archs.py
REFUSED = {"cross_stitch", "ple", "ltb"}  # at shared_rep: each task reads its own column or representation


def pairs() -> list:
    """Each balancer as shipped, plus the methods at the shared representation (their other grad_source), on each
    architecture. The default run takes each balancer on one architecture, the architectures in turn (each
    about equally often), and every refused pair; the slow run takes every pair."""
    found = []
    rows = [(b, ()) for b in config_options()["balancer"]]
    rows += [(b, ("balancer.grad_source=shared_rep",)) for b in ("mgda", "gradnorm")]
    for i, (balancer, extra) in enumerate(rows):
        for j, arch in enumerate(ARCHS):
            default = (i + j) % len(ARCHS) == 0 or (extra and arch in REFUSED)
            found.append(pytest.param(balancer, arch, extra, marks=() if default else pytest.mark.slow))
    return found


@pytest.mark.parametrize(("balancer", "arch", "extra"), pairs())
def test_every_balancer_trains_on_every_architecture(compose_cfg, balancer, arch, extra):
    overrides = ("model=mlp", "model.widths=[8,8]", f"model/arch={arch}", f"balancer={balancer}", *extra)
    cfg = compose_cfg(*overrides)
    torch.manual_seed(0)
    model: MultiTaskModel = build("model", cfg.model, MultiTaskModel, input_shape=(4,), heads=TASKS)
    node = node_dict(cfg.balancer)
    bal, validation = built_balancer(model, cfg.balancer)
    if arch in REFUSED and getattr(bal, "grad_source", None) == "shared_rep":
        with pytest.raises(ConfigError) as info:
            check_model_balancer(model, bal, node)
        typed = "grad_source" in node  # GradDrop has no other source: refused by name
        assert str(info.value).startswith(
            "balancer.grad_source=shared_rep: "
            if typed
            else "balancer: GradDrop works at the shared representation only: "
        )
        assert "has no representation shared by all tasks" in str(info.value)
        assert "\n" not in str(info.value) and typed == str(info.value).endswith("use grad_source=shared_params")
        return
    check_model_balancer(model, bal, node)
    # The coordinate-wise median of three tasks' gradients is 0 where LTB's sampled branches give each parameter one
    # task's gradient only: nothing need move, and that is the method, not a failure.
    two_steps(model, bal, validation, (4,), must_move=(balancer, arch) != ("trimmed_mean", "ltb"))


def built_balancer(model: MultiTaskModel, balancer_node) -> tuple[Balancer, GivenBatches | None]:
    """The balancer as the engine builds it, with a bilevel method's validation stream (one more random batch)."""
    bilevel = needs_validation(target_of("balancer", node_dict(balancer_node)))
    validation = model_batches(model, TASKS, lr=0.05) if bilevel else None
    bal = build(
        "balancer",
        balancer_node,
        Balancer,
        ignore=ENGINE_KEYS.get("balancer", ()),
        task_names=list(TASKS),
        shared_params=list(model.shared_parameters()),
        shared_layer=model.last_shared_layer,
        world_size=1,
        initial_losses_known={t: None for t in TASKS},
        validation=validation,
    )
    return bal, validation


def two_steps(model: MultiTaskModel, bal: Balancer, validation, shape: tuple[int, ...], must_move: bool = True) -> None:
    model.set_progress(1, 10)  # past LTB's warm-up: its branches are sampled
    opt = torch.optim.SGD([*model.parameters(), *bal.parameters()], lr=0.05)
    gen = torch.Generator().manual_seed(1)
    before = [p.detach().clone() for p in model.parameters()]
    # MoDo and SDMGrad draw their independent batches from the micro-batches of one step
    k = next(k for k in (1, 2, 3) if bal.accumulation_problem(k) is None)
    for _ in range(2):
        opt.zero_grad()
        for _ in range(k):
            x = torch.randn(6, *shape, generator=gen)
            out = model(x)
            targets = {t: torch.randn(6, n, generator=gen) for t, n in TASKS.items()}
            losses = {t: F.mse_loss(out.preds[t], targets[t]) for t in TASKS}
            ctx = BackwardContext(None, 1.0, k)
            if validation is not None:
                validation.feed((x, targets), validation_batch(shape))
            metrics = bal.backward(losses, out.shared, ctx)
        opt.step()
        metrics |= bal.step(False)
        assert all(torch.isfinite(v).all() for v in metrics.values())
    shared = {id(p) for p in model.shared_parameters()}
    moved = [not torch.equal(b, p) for b, p in zip(before, model.parameters()) if id(p) in shared]
    assert any(moved) or not must_move, "no shared parameter moved"
    assert all(torch.isfinite(p).all() for p in model.parameters())


def validation_batch(shape: tuple[int, ...]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(2)
    return torch.randn(6, *shape, generator=gen), {t: torch.randn(6, n, generator=gen) for t, n in TASKS.items()}


class SmallResNet(MultiTaskModel):
    """A ResNet of torchvision's BasicBlocks, two per stage, widths 4 to 8: feature maps at every stage (MTAN)."""

    def __init__(self, input_shape, heads, arch=None) -> None:
        trunk = self.make()
        task_heads = {
            t: nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, n)) for t, n in heads.items()
        }
        super().__init__(
            trunk,
            task_heads,
            trunk.layer2[-1].conv2,
            stages=(5, 6),
            stem=4,
            make_trunk=self.make,
            input_shape=input_shape,
            arch=arch,
        )

    @staticmethod
    def make() -> nn.Sequential:
        down = nn.Sequential(nn.Conv2d(4, 8, 1, stride=2, bias=False), nn.BatchNorm2d(8))
        return nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(3, 4, 3, padding=1, bias=False),
                bn1=nn.BatchNorm2d(4),
                relu=nn.ReLU(),
                maxpool=nn.MaxPool2d(2),
                layer1=nn.Sequential(BasicBlock(4, 4), BasicBlock(4, 4)),
                layer2=nn.Sequential(BasicBlock(4, 8, stride=2, downsample=down), BasicBlock(8, 8)),
            )
        )


@pytest.mark.parametrize("balancer", config_options()["balancer"])
def test_every_balancer_trains_on_mtan(compose_cfg, balancer):
    cfg = compose_cfg(f"balancer={balancer}")
    torch.manual_seed(0)
    model = SmallResNet((3, 8, 8), TASKS, arch=MTAN)
    bal, validation = built_balancer(model, cfg.balancer)
    if getattr(bal, "grad_source", None) == "shared_rep":
        with pytest.raises(ConfigError, match=r"^balancer(\.grad_source=shared_rep|: GradDrop .*): MTAN has no repr"):
            check_model_balancer(model, bal, node_dict(cfg.balancer))
        return
    two_steps(model, bal, validation, (3, 8, 8))
