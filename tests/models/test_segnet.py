"""SegNet and SegNet-MTAN: shapes, parameter counts against the references, the shared/task split, and exact
per-task gradients for the gradient balancers on MTAN (whose heads read the trunk at every stage)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtl_bench.balancers import MGDA, BackwardContext, GradDrop, NashMTL, PCGrad, UPGrad
from mtl_bench.gradient_engine.blocks import combine
from mtl_bench.gradient_engine.gradient_balancer import GradientBalancer
from mtl_bench.gradient_engine.gramian import gramian
from mtl_bench.gradient_engine.graph import task_params
from mtl_bench.models import SegNet, SegNetMTAN
from tests.helpers.param_jacobian import param_jacobian

TASKS = {"segmentation": 5, "depth": 1, "normal": 3}
SHAPE = (3, 32, 32)
TINY = {"filters": [4, 4, 6, 8, 8]}  # five stages, as the reference; 32x32 pools down to 1x1
MODELS = [SegNet, SegNetMTAN]


def batch(n: int = 2, seed: int = 0) -> tuple[Tensor, dict[str, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *SHAPE, generator=g)
    label = torch.randint(-1, TASKS["segmentation"], (n, *SHAPE[1:]), generator=g)  # -1: ignored pixels
    depth = torch.rand(n, 1, *SHAPE[1:], generator=g) * (torch.rand(n, 1, *SHAPE[1:], generator=g) > 0.2)
    normal = F.normalize(torch.randn(n, 3, *SHAPE[1:], generator=g), dim=1)
    normal[:, :, :4] = 0  # invalid pixels
    return x, {"segmentation": label, "depth": depth, "normal": normal}


def losses_of(preds: dict[str, Tensor], y: dict[str, Tensor]) -> dict[str, Tensor]:
    """The references' calc_loss (nash-mtl experiments/nyuv2/trainer.py), with cross-entropy on our logits."""
    out = {}
    for task, pred in preds.items():
        target = y[task]
        if task == "segmentation":
            out[task] = F.cross_entropy(pred, target, ignore_index=-1)
            continue
        mask = (target.sum(1, keepdim=True) != 0).float()
        if task == "depth":
            out[task] = ((pred - target).abs() * mask).sum() / mask.sum()
        else:
            out[task] = 1 - (pred * target * mask).sum() / mask.sum()
    return out


def n_params(params) -> int:
    return sum(p.numel() for p in params)


# ---------------------------------------------------------------------------------------------- the models


@pytest.mark.parametrize("cls", MODELS)
def test_predictions_at_input_resolution(cls):
    torch.manual_seed(0)
    model = cls(SHAPE, TASKS, **TINY)
    x, _ = batch()
    out = model(x)
    assert out.shared.shape == (2, 4, 32, 32)  # the decoder's last map: filters[0] channels
    assert {t: tuple(p.shape) for t, p in out.preds.items()} == {t: (2, c, 32, 32) for t, c in TASKS.items()}
    torch.testing.assert_close(out.preds["normal"].norm(dim=1), torch.ones(2, 32, 32))  # unit normals
    assert out.preds["segmentation"].logsumexp(1).abs().min() > 1e-3  # logits, not log-probabilities
    assert list(model(x, tasks=["depth"]).preds) == ["depth"]  # per-task steps run one task's path
    # Cityscapes-like heads, another resolution, fewer stages
    small = cls((3, 16, 24), {"segmentation": 7, "depth": 1}, filters=[3, 5, 5])
    preds = small(torch.randn(2, 3, 16, 24)).preds
    assert {t: tuple(p.shape) for t, p in preds.items()} == {"segmentation": (2, 7, 16, 24), "depth": (2, 1, 16, 24)}


# The references' counts, from lorenmt/mtan c36c30b (model_segnet_mtan.py, model_segnet_split.py), as copied by
# AvivNavon/nash-mtl cce1840 experiments/nyuv2/models.py and Cranial-XIX/FAMO 0a6ad06 experiments/cityscapes/
# models.py: sum(p.numel() for p in model.parameters()) and for model.shared_parameters() (every parameter but
# `pred_task*`), and for MTAN's `shared_modules()` (the attention masks left out). MTAN's own script adds 3 for
# its uncertainty weights (`logsigma`), which are not part of the model here.
@pytest.mark.parametrize(
    ("cls", "shape", "heads", "total", "shared", "shared_modules"),
    [
        (SegNetMTAN, (3, 288, 384), {"segmentation": 13, "depth": 1, "normal": 3}, 44_229_073, 44_117_184, 35_163_456),
        (SegNet, (3, 288, 384), {"segmentation": 13, "depth": 1, "normal": 3}, 25_055_185, 24_943_296, None),
        (SegNetMTAN, (3, 128, 256), {"segmentation": 7, "depth": 1}, 41_206_984, 41_132_608, None),
        (SegNet, (3, 128, 256), {"segmentation": 7, "depth": 1}, 25_017_672, 24_943_296, None),
    ],
)
def test_parameter_counts_match_the_references(cls, shape, heads, total, shared, shared_modules):
    model = cls(shape, heads)
    assert n_params(model.parameters()) == total
    assert n_params(model.shared_parameters()) == shared
    if shared_modules is not None:
        split = cls(shape, heads, attention_in_shared=False)
        assert n_params(split.shared_parameters()) == shared_modules


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("attention_in_shared", [True, False])
def test_shared_and_task_parameters_partition_the_model(cls, attention_in_shared):
    kwargs = {"attention_in_shared": attention_in_shared} if cls is SegNetMTAN else {}
    model = cls(SHAPE, TASKS, **TINY, **kwargs)
    shared = {id(p) for p in model.shared_parameters()}
    tasks = {t: {id(p) for p in model.task_parameters(t)} for t in TASKS}
    everything = {id(p) for p in model.parameters()}
    assert shared | set().union(*tasks.values()) == everything
    assert sum(len(ids) for ids in tasks.values()) + len(shared) == len(everything)  # disjoint
    assert all(id(p) in shared for p in model.last_shared_layer.parameters())
    if cls is SegNetMTAN:
        attention = {id(p) for p in model.attention["depth"].parameters()}
        assert attention <= (shared if attention_in_shared else tasks["depth"])
        assert {id(p) for p in model.attention_blocks.parameters()} <= shared  # the reference's shared_modules()


@pytest.mark.parametrize("cls", MODELS)
def test_last_shared_layer_is_the_decoders_last_conv(cls):
    model = cls(SHAPE, TASKS, **TINY)
    layer = model.last_shared_layer
    assert isinstance(layer, nn.Conv2d) and layer.out_channels == 4
    captured = {}
    layer.register_forward_hook(lambda m, i, o: captured.setdefault("out", o))
    out = model(batch()[0])
    # conv -> BatchNorm -> ReLU is the shared representation
    bn = model.trunk.conv_block_dec[0][1]
    torch.testing.assert_close(
        out.shared, F.relu(F.batch_norm(captured["out"], None, None, bn.weight, bn.bias, training=True))
    )


def test_segnet_heads_read_only_the_shared_map_and_mtan_heads_read_every_stage():
    x, y = batch()
    for cls, cut in ((SegNet, True), (SegNetMTAN, False)):
        model = cls(SHAPE, TASKS, **TINY)
        out = model(x)
        ids = {id(p) for p in model.shared_parameters()}
        for task, loss in losses_of(out.preds, y).items():
            own, is_cut = task_params(loss, out.shared, ids)
            assert is_cut is cut
            assert {id(p) for p in own} == {id(p) for p in model.task_parameters(task)}
        if cls is SegNet:
            torch.testing.assert_close(out.preds["depth"], model.heads["depth"](out.shared))


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (SegNet, {"filters": []}, "filters:"),
        (SegNet, {"filters": [4, 0]}, "filters:"),
        (SegNetMTAN, {"filters": [4, 2.5]}, "filters:"),
        (SegNet, {"input_shape": (3, 30, 32)}, "input_shape:"),
        (SegNetMTAN, {"input_shape": (32, 32)}, "input_shape:"),
        (SegNetMTAN, {"normalize": "normal"}, "normalize:"),
        (SegNetMTAN, {"attention_in_shared": "yes"}, "attention_in_shared:"),
    ],
)
def test_bad_values_name_the_argument(cls, kwargs, message):
    args = {"input_shape": SHAPE, "heads": TASKS, **TINY, **kwargs}
    with pytest.raises(ValueError, match=f"^{message}"):
        cls(**args)


# ---------------------------------------------------------------------------------------------- exact gradients


def per_task_gradients(
    model: nn.Module, params: list[Tensor], x: Tensor, y: dict[str, Tensor], names: list[str]
) -> list[list[Tensor]]:
    """Each task's gradient at `params` from its own backward (T separate autograd.grad calls), in `names` order."""
    out = model(x)
    losses = losses_of(out.preds, y)
    return [list(torch.autograd.grad(losses[t], params, retain_graph=True, allow_unused=True)) for t in names]


def record_solve(balancer: GradientBalancer, seen: dict) -> None:
    solve = balancer._solve

    def recording(gram, losses):
        seen["gram"] = gram.clone()
        seen["solution"] = solution = solve(gram, losses)
        return solution

    balancer._solve = recording  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "make",
    [lambda names, params: PCGrad(names, params, seed=1), lambda names, params: UPGrad(names, params)],
    ids=["pcgrad", "upgrad"],
)
@pytest.mark.parametrize("attention_in_shared", [True, False])
def test_gradient_balancers_get_the_exact_jacobian_on_mtan(make, attention_in_shared):
    torch.manual_seed(0)
    model = SegNetMTAN(SHAPE, TASKS, **TINY, attention_in_shared=attention_in_shared)
    shared = list(model.shared_parameters())
    own = {t: list(model.task_parameters(t)) for t in TASKS}
    x, y = batch()
    balancer = make(list(TASKS), shared)
    names = balancer.task_names  # the balancer's order (sorted): rows of J and of the Gramian
    expected = per_task_gradients(model, shared, x, y, names)  # BatchNorm in train mode: same batch statistics
    expected_own = {t: torch.autograd.grad(losses_of(model(x).preds, y)[t], own[t]) for t in TASKS}
    blocks = [
        torch.stack([g if g is not None else torch.zeros_like(p) for g in gs]) for p, gs in zip(shared, zip(*expected))
    ]

    seen: dict = {}
    record_solve(balancer, seen)
    model.zero_grad(set_to_none=True)
    out = model(x)
    balancer.backward(losses_of(out.preds, y), out.shared)

    torch.testing.assert_close(seen["gram"], gramian(blocks), rtol=1e-4, atol=1e-6)
    direction = combine(blocks, seen["solution"].weights)
    for p, d in zip(shared, direction):
        torch.testing.assert_close(p.grad, d, rtol=1e-4, atol=1e-6)
    for t in TASKS:  # each task's own parameters: the gradient of its loss (c_i = 1)
        for p, g in zip(own[t], expected_own[t]):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    # what this guards against: the two-stage Jacobian (gradients at `shared`, then one product through the
    # trunk) misses the attention paths into the encoder and decoder
    out = model(x)
    losses = losses_of(out.preds, y)
    rows = torch.stack([torch.autograd.grad(losses[t], out.shared, retain_graph=True)[0] for t in names])
    through_shared = param_jacobian(out.shared, shared, rows)
    assert not torch.allclose(through_shared[0], blocks[0], rtol=1e-3, atol=1e-6)


def test_per_task_mode_on_mtan_matches_the_joint_step():
    torch.manual_seed(0)
    joint = SegNetMTAN(SHAPE, TASKS, **TINY)
    per_task = SegNetMTAN(SHAPE, TASKS, **TINY)
    per_task.load_state_dict(joint.state_dict())
    x, y = batch()
    out = joint(x)
    UPGrad(list(TASKS), list(joint.shared_parameters())).backward(losses_of(out.preds, y), out.shared)
    balancer = UPGrad(list(TASKS), list(per_task.shared_parameters()))
    ctx = BackwardContext()
    for task in TASKS:
        out = per_task(x, tasks=[task])
        balancer.backward_task(task, losses_of(out.preds, y)[task], out.shared, ctx)
    balancer.step(False)
    for (name, a), b in zip(joint.named_parameters(), per_task.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "make",
    [
        lambda names, params: MGDA(names, params, grad_source="shared_rep"),
        lambda names, params: GradDrop(names, params),
    ],
    ids=["mgda_ub", "graddrop"],
)
def test_methods_at_the_shared_representation_refuse_mtan(make):
    model = SegNetMTAN(SHAPE, TASKS, **TINY)
    x, y = batch()
    out = model(x)
    with pytest.raises(ValueError, match="other than through the shared representation"):
        make(list(TASKS), list(model.shared_parameters())).backward(losses_of(out.preds, y), out.shared)
    # on plain SegNet (the heads read only `shared`) the same methods run
    model = SegNet(SHAPE, TASKS, **TINY)
    out = model(x)
    make(list(TASKS), list(model.shared_parameters())).backward(losses_of(out.preds, y), out.shared)


# ---------------------------------------------------------------------------------------------- training


def nash(names, params):
    return NashMTL(names, params)


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize(
    "make", [nash, lambda names, params: PCGrad(names, params, seed=0)], ids=["nash_mtl", "pcgrad"]
)
def test_two_training_steps_through_a_balancer(cls, make):
    torch.manual_seed(0)
    model = cls(SHAPE, TASKS, **TINY)
    balancer = make(list(TASKS), list(model.shared_parameters()))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    ctx = BackwardContext()
    for step in range(2):
        x, y = batch(seed=step)
        optimizer.zero_grad(set_to_none=True)
        out = model(x)
        losses = losses_of(out.preds, y)
        assert all(torch.isfinite(loss) for loss in losses.values())
        metrics = balancer.backward(losses, out.shared, ctx)
        assert {f"weight/{t}" for t in TASKS} <= set(metrics)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        optimizer.step()
        balancer.step(False)
    assert all(not torch.equal(p, q) for p, q in zip(model.parameters(), before))
