"""SDMGrad: the weights against torchjd 0.18's SDMGradWeighting on the same matrix, the parameters of LibMTL
main's SDMGrad after 3 steps of 3 batches (numbers taken from it), resume and skipped steps."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import BackwardContext, MoDo, SDMGrad
from tests.helpers.balancer_kit import TASKS3, batch, make_model, run_ddp, task_losses


def train_three_micro_batches(model, balancer, steps: int, lr: float = 0.1) -> list[dict]:
    """SGD with 3 accumulated micro-batches per step: batch seeds 3s + 1, 3s + 2 (ξ, ξ') and 3s (ζ), the draws
    LibMTL gives those roles (it takes ζ first, we take it last)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    ctx = BackwardContext(factor=1 / 3, accumulation_steps=3)
    history = []
    for step in range(steps):
        opt.zero_grad()
        for j in range(3):
            x, y = batch(seed=3 * step + (j + 1) % 3)
            out, losses = task_losses(model, x, y)
            metrics = balancer.backward(losses, out.shared, ctx)
        opt.step()
        history.append(metrics | balancer.step())
    return history


def assert_parameters_are(model, expected: dict) -> None:
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach().flatten(), torch.tensor(expected[name]), rtol=1e-5, atol=1e-6, msg=name)


def test_weights_match_torchjd():
    aggregation = pytest.importorskip("torchjd.aggregation")
    g = torch.Generator().manual_seed(1)
    j1, j2, j3 = (torch.randn(3, 7, generator=g) for _ in range(3))
    reference = aggregation.SDMGradWeighting(lr=5.0, momentum=0.5, n_iter=20, lambda_=0.3)
    ours = SDMGrad(["a", "b", "c"], [torch.zeros(7, requires_grad=True)])
    for _ in range(3):
        expected = reference(j2 @ j3.T)
        solution = ours.weighting(j2 @ j3.T, torch.zeros(3))
        ours.weighting.w.copy_(solution.state["w"])
        weights = solution.weights
        torch.testing.assert_close(weights, expected, rtol=1e-5, atol=1e-6)


# LibMTL main (github.com/median-research-group/LibMTL, commit 4336804847eaa5e0b924b743d76beec7ac3fdc97),
# LibMTL/weighting/SDMGrad.py with that commit's abstract_weighting.py, on tests.helpers.balancer_kit's make_model()
# (trunk as encoder, heads as decoders), 3 steps, each
# backward(losses of batch seeds 3s, 3s + 1, 3s + 2, SDMGrad_lamda=0.3, SDMGrad_niter=20);
# SGD lr 0.1, the heads at lr 0.1 / 3 (LibMTL sums their 3 batches' gradients; we average them).
SDMGRAD_MAIN_PARAMS_AFTER_3 = {
    "trunk.0.weight": [
        0.0219952725,
        0.304803103,
        -0.490391105,
        -0.425650924,
        -0.201045543,
        0.153733134,
        0.0187269151,
        0.467140675,
        -0.0707317516,
        0.215068072,
        -0.204713523,
        -0.168850467,
    ],
    "trunk.0.bias": [-0.572084248, -0.385766894, -0.255594373, -0.035097532],
    "trunk.2.weight": [
        0.161764175,
        0.297592908,
        -0.342014998,
        -0.23115097,
        0.192034096,
        0.410495609,
        -0.0900853723,
        0.372971416,
        -0.109452941,
        0.0395826101,
        0.469756186,
        -0.480514973,
        -0.323435664,
        -0.125989288,
        -0.203500822,
        0.430668086,
        -0.388592184,
        -0.224003553,
        -0.359104455,
        -0.490807027,
    ],
    "trunk.2.bias": [-0.241531625, 0.423862964, 0.277447522, 0.257953316, 0.103114299],
    "heads.a.weight": [-0.226661399, 0.0733051971, -0.403798968, -0.330890089, -0.23089312],
    "heads.a.bias": [0.281861097],
    "heads.b.weight": [
        0.195363581,
        -0.122157857,
        0.0540781021,
        0.371649802,
        0.52167058,
        0.0384410135,
        0.089114964,
        0.358539313,
        -0.128195554,
        0.181561992,
    ],
    "heads.b.bias": [-0.0865134969, -0.0199157316],
    "heads.c.weight": [-0.171891674, 0.184151798, 0.132148847, -0.2969414, 0.112668142],
    "heads.c.bias": [0.107952386],
}


def test_matches_libmtl_main_reference_numbers():
    model = make_model()
    train_three_micro_batches(model, SDMGrad(list(TASKS3), list(model.trunk.parameters())), 3)
    assert_parameters_are(model, SDMGRAD_MAIN_PARAMS_AFTER_3)


# "skip": loss a also reads the trunk's first layer directly, so `shared` is no cut and the third draw's Jacobian is
# taken and combined; otherwise its direction is one backward of Σ w_i g_i from `shared` through the trunk.
@pytest.mark.parametrize("case", ["cut", "skip"])
@pytest.mark.parametrize("method", [SDMGrad, MoDo])
def test_the_third_draw_gives_the_trunk_w_times_its_jacobian(method, case: str):
    """After one step of three micro-batches the trunk's `.grad` is Σ_i w_i ∇L_i on the third batch, w the step's
    weights, and each head's `.grad` the mean of its three batches' gradients (a loss scale of 2**4 cancels)."""
    model = make_model()
    bal = method(list(TASKS3), list(model.trunk.parameters()))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    ctx = BackwardContext(factor=1 / 3, accumulation_steps=3, scaler=scaler)

    def forward(seed: int):
        out, losses = task_losses(model, *batch(seed=seed))
        if case == "skip":
            losses["a"] = losses["a"] + model.trunk[0].weight.square().sum()
        return out, losses

    for seed in range(3):
        out, losses = forward(seed)
        metrics = bal.backward(losses, out.shared, ctx)
    got = {name: p.grad / scaler.get_scale() for name, p in model.named_parameters()}
    weights = torch.stack([metrics[f"weight/{t}"] for t in TASKS3])
    _, third = forward(2)
    trunk = list(model.trunk.parameters())
    for p, name in zip(trunk, (n for n, _ in model.named_parameters() if n.startswith("trunk."))):
        expected = sum(w * torch.autograd.grad(third[t], p, retain_graph=True)[0] for w, t in zip(weights, TASKS3))
        torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-6)
    for t in TASKS3:
        for name, p in model.heads[t].named_parameters():
            expected = sum(torch.autograd.grad(forward(seed)[1][t], p)[0] for seed in range(3)) / 3
            torch.testing.assert_close(got[f"heads.{t}.{name}"], expected, rtol=1e-5, atol=1e-6)


def make_for_ranks(names, model):
    return SDMGrad(names, list(model.trunk.parameters()))


@pytest.mark.slow  # two gloo processes, each starting torch
def test_ddp_ranks_hold_the_same_state_with_three_micro_batches(tmp_path):
    """Two ranks, three accumulated micro-batches a step (the first two under `no_sync`): the third draw's backward
    through the trunk carries DDP's all-reduce, and both ranks end with the same w and parameters."""
    r0, _ = run_ddp(tmp_path, make_for_ranks, steps=2, micro=3)
    w = r0["state"]["weighting.w"]
    assert not torch.allclose(w, torch.full_like(w, 1 / len(w)))  # w moved


def test_resume_continues_with_the_same_w():
    model = make_model()
    bal = SDMGrad(list(TASKS3), list(model.trunk.parameters()))
    train_three_micro_batches(model, bal, 2)
    again = SDMGrad(list(TASKS3), list(model.trunk.parameters()))
    again.load_state_dict(bal.state_dict())
    assert set(bal.state_dict()) == {"weighting.w"} and torch.equal(again.weighting.w, bal.weighting.w)
    assert not torch.equal(bal.weighting.w, torch.full((3,), 1 / 3))  # w moved


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="^n_iter: must be an integer >= 1"):
        SDMGrad(list(TASKS3), [torch.zeros(1, requires_grad=True)], n_iter=0)
    with pytest.raises(ValueError, match=r"^momentum: must be a number in \[0, 1\)"):
        SDMGrad(list(TASKS3), [torch.zeros(1, requires_grad=True)], momentum=1.0)
