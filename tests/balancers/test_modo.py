"""MoDo: the λ step against torchjd 0.18's MoDoWeighting on the same matrix, the parameters of LibMTL main's MoDo
after 3 steps of 3 batches (numbers taken from it), the two-batch variant, and the accumulation it needs."""

from __future__ import annotations

import pytest
import torch

from mtl_bench.balancers import BackwardContext, MoDo
from mtl_bench.gradient_engine.multi_batch import project_to_simplex
from tests.helpers.balancer_kit import TASKS3, batch, make_model, task_losses


def train_three_micro_batches(model, balancer, steps: int, lr: float = 0.1) -> list[dict]:
    """SGD with 3 accumulated micro-batches per step (batch seeds 3s, 3s + 1, 3s + 2)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    ctx = BackwardContext(factor=1 / 3, accumulation_steps=3)
    history = []
    for step in range(steps):
        opt.zero_grad()
        for j in range(3):
            x, y = batch(seed=3 * step + j)
            out, losses = task_losses(model, x, y)
            metrics = balancer.backward(losses, out.shared, ctx)
        opt.step()
        history.append(metrics | balancer.step())
    return history


def assert_parameters_are(model, expected: dict) -> None:
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach().flatten(), torch.tensor(expected[name]), rtol=1e-5, atol=1e-6, msg=name)


def test_projection_onto_the_simplex_by_hand():
    assert project_to_simplex(torch.tensor([0.2, 0.3, 0.5])).tolist() == pytest.approx([0.2, 0.3, 0.5])
    assert project_to_simplex(torch.tensor([2.0, 0.0, -1.0])).tolist() == [1.0, 0.0, 0.0]
    assert project_to_simplex(torch.tensor([0.6, 0.6, -1.0])).tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_lambda_step_matches_torchjd():
    aggregation = pytest.importorskip("torchjd.aggregation")
    g = torch.Generator().manual_seed(0)
    j1, j2 = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    reference = aggregation.MoDoWeighting(gamma=0.2, rho=0.1)
    ours = MoDo(
        ["a", "b", "c"],
        shared_params=[torch.zeros(7, requires_grad=True)],
        gamma=0.2,
        rho=0.1,
    )
    for _ in range(3):
        expected = reference(j1 @ j2.T)
        solution = ours.weighting(j1 @ j2.T, torch.zeros(3))
        ours.weighting.lambdas.copy_(solution.state["lambdas"])
        lam = solution.weights
        torch.testing.assert_close(lam, expected)


# LibMTL main (github.com/median-research-group/LibMTL, commit 4336804847eaa5e0b924b743d76beec7ac3fdc97),
# LibMTL/weighting/MoDo.py with that commit's abstract_weighting.py, on tests.helpers.balancer_kit's make_model()
# (trunk as encoder, heads as decoders), 3 steps, each
# backward(losses of batch seeds 3s, 3s + 1, 3s + 2, MoDo_gamma=0.05, MoDo_rho=0.1);
# SGD lr 0.1.
MODO_MAIN_PARAMS_AFTER_3 = {
    "trunk.0.weight": [
        0.0206344072,
        0.314956874,
        -0.462372273,
        -0.41360575,
        -0.22779265,
        0.169599891,
        0.0324792117,
        0.455981076,
        -0.0367558412,
        0.0920018479,
        -0.153663963,
        -0.142036244,
    ],
    "trunk.0.bias": [-0.550198555, -0.385973662, -0.242595732, -0.0196933094],
    "trunk.2.weight": [
        0.179678977,
        0.278928369,
        -0.349837661,
        -0.213485941,
        0.175204232,
        0.413058102,
        -0.106658764,
        0.377980053,
        -0.111346312,
        0.0208329819,
        0.430393547,
        -0.448298872,
        -0.290283203,
        -0.115210265,
        -0.186396226,
        0.427236438,
        -0.3369174,
        -0.238527253,
        -0.36337769,
        -0.464051187,
    ],
    "trunk.2.bias": [-0.252027333, 0.424141616, 0.261749655, 0.233368337, 0.0520042554],
    "heads.a.weight": [-0.23127684, 0.0759975538, -0.398708969, -0.327850997, -0.229373559],
    "heads.a.bias": [0.294364959],
    "heads.b.weight": [
        0.201744944,
        -0.122485191,
        0.060979221,
        0.367724508,
        0.52864641,
        0.0452690087,
        0.087915875,
        0.372202635,
        -0.145295009,
        0.189716324,
    ],
    "heads.b.bias": [-0.0915986076, -0.027748296],
    "heads.c.weight": [-0.169604719, 0.183332622, 0.1258315, -0.29622829, 0.104681402],
    "heads.c.bias": [0.0991213769],
}


def test_matches_libmtl_main_reference_numbers():
    model = make_model()
    history = train_three_micro_batches(model, MoDo(list(TASKS3), list(model.trunk.parameters()), gamma=0.05), 3)
    assert_parameters_are(model, MODO_MAIN_PARAMS_AFTER_3)
    assert history[-1]["weight/a"].item() != pytest.approx(1 / 3)  # λ moved


def test_two_micro_batches_update_on_their_mean():
    model = make_model()
    bal = MoDo(list(TASKS3), list(model.trunk.parameters()), gamma=0.05)
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    jacobians = []
    for j in range(2):
        x, y = batch(seed=j)
        out, losses = task_losses(model, x, y)
        rows = [torch.autograd.grad(losses[t], list(model.trunk.parameters()), retain_graph=True) for t in TASKS3]
        jacobians.append(torch.stack([torch.cat([g.flatten() for g in r]) for r in rows]))
        bal.backward(losses, out.shared, ctx)
    lam = torch.full((3,), 1 / 3)
    lam = project_to_simplex(lam - 0.05 * (jacobians[0] @ jacobians[1].T @ lam + 0.1 * lam))
    expected = lam @ (jacobians[0] + jacobians[1]) / 2
    got = torch.cat([p.grad.flatten() for p in model.trunk.parameters()])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_needs_two_or_three_micro_batches():
    model = make_model()
    bal = MoDo(list(TASKS3), list(model.trunk.parameters()))
    x, y = batch()
    out, losses = task_losses(model, x, y)
    with pytest.raises(RuntimeError, match="MoDo needs trainer.grad_accumulation_steps=2 or 3"):
        bal.backward(losses, out.shared, BackwardContext())
    assert "has no per-task mode" in bal.per_task_problem()


def test_scaler_gives_the_fp32_parameters():
    """The direction is written once per step in the scaled units the accumulated heads are in."""
    expected, ours = make_model(), make_model()
    train_three_micro_batches(expected, MoDo(list(TASKS3), list(expected.trunk.parameters()), gamma=0.05), 2)
    bal = MoDo(list(TASKS3), list(ours.trunk.parameters()), gamma=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    ctx = BackwardContext(scaler=scaler, factor=1 / 3, accumulation_steps=3)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    for step in range(2):
        opt.zero_grad()
        for j in range(3):
            x, y = batch(seed=3 * step + j)
            out, losses = task_losses(ours, x, y)
            bal.backward(losses, out.shared, ctx)
        scaler.step(opt)
        scaler.update()
        bal.step()
    for p, q in zip(ours.parameters(), expected.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
