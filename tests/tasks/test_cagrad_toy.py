"""tasks=cagrad_toy (mtl_bench/tasks/cagrad_toy.py): the objectives against their closed form, the Pareto set and the
stationarity measure on hand cases, and a short LS run through the engine against a hand-written Adam loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from benchmarks.known_answers import engine_trajectory
from mtl_bench.engine.builders import build
from mtl_bench.engine.evaluate import evaluate
from mtl_bench.models import DecisionVariables
from mtl_bench.tasks import CAGradToy, TaskSet
from mtl_bench.tasks.cagrad_toy import min_norm_element, objectives, pareto_set, stationarity


def closed_form(x1: float, x2: float, scale: float) -> tuple[float, float]:
    """The papers' formula written out in float64."""
    c1, c2 = max(math.tanh(x2 / 2), 0.0), max(math.tanh(-x2 / 2), 0.0)
    log1 = math.log(max(abs(-(x1 + 7) / 2 - math.tanh(-x2)), 5e-6)) + 6
    log2 = math.log(max(abs(-(x1 - 3) / 2 + math.tanh(-x2) + 2), 5e-6)) + 6
    sq1 = ((x1 - 7) ** 2 + 0.1 * (x2 + 8) ** 2) / 10 - 20
    sq2 = ((x1 + 7) ** 2 + 0.1 * (x2 + 8) ** 2) / 10 - 20
    return scale * (c1 * log1 + c2 * sq1), c1 * log2 + c2 * sq2


def closed_form_gradient(x1: float, x2: float) -> np.ndarray:
    """grad f1 + grad f2 (scale 1) by hand, where x2 > 0 (the log terms: u1 = tanh(x2) - (x1+7)/2,
    u2 = 3.5 - x1/2 - tanh(x2), both away from the clamp on the path below)."""
    c1, dc1 = math.tanh(x2 / 2), 0.5 / math.cosh(x2 / 2) ** 2
    sech2 = 1 / math.cosh(x2) ** 2
    u1, u2 = math.tanh(x2) - (x1 + 7) / 2, 3.5 - x1 / 2 - math.tanh(x2)
    g1 = np.array([c1 * -0.5 / u1, dc1 * (math.log(abs(u1)) + 6) + c1 * sech2 / u1])
    g2 = np.array([c1 * -0.5 / u2, dc1 * (math.log(abs(u2)) + 6) - c1 * sech2 / u2])
    return g1 + g2


@pytest.mark.parametrize("scale", [0.1, 1.0])
def test_objectives_equal_the_closed_form(scale):
    points = [(-8.5, 7.5), (9.0, 9.0), (-7.5, -0.5), (9.0, -1.0), (-8.5, -5.0), (3.0, -8.0), (0.3, 2.0)]
    got = objectives(torch.tensor(points, dtype=torch.float64), scale)
    want = torch.tensor([closed_form(x1, x2, scale) for x1, x2 in points], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_min_norm_element_of_two_vectors_by_hand():
    pairs = {
        ((1.0, 0.0), (0.0, 1.0)): (0.5, 0.5),  # interior: the segment's foot from the origin
        ((1.0, 0.0), (-1.0, 0.0)): (0.0, 0.0),  # opposed: the origin is on the segment
        ((1.0, 0.0), (2.0, 0.0)): (1.0, 0.0),  # aligned: the shorter end
        ((3.0, 1.0), (3.0, 1.0)): (3.0, 1.0),  # equal
        ((2.0, 0.0), (0.0, 4.0)): (1.6, 0.8),  # t = 0.8: (1.6, 0.8) is orthogonal to g1 - g2 = (2, -4)
        ((2.0, 2.0), (0.0, 4.0)): (2.0, 2.0),  # t = 1: the foot lies past g1
    }
    for (g1, g2), want in pairs.items():
        got = min_norm_element(torch.tensor([g1], dtype=torch.float64), torch.tensor([g2], dtype=torch.float64))
        torch.testing.assert_close(got, torch.tensor([want], dtype=torch.float64))


def test_pareto_set_is_stationary_and_matches_its_known_points():
    curve = pareto_set(401)
    assert curve[0] == pytest.approx([-7.0, -8.43446], abs=1e-5)  # f2's minimum
    assert curve[-1] == pytest.approx([7.0, -8.43446], abs=1e-5)  # f1's minimum
    assert curve[200] == pytest.approx([0.0, -8.35511], abs=1e-5)  # the papers' drawn x2 = -8.3552 holds here only
    for scale in (0.1, 1.0):
        values = stationarity(torch.from_numpy(curve), scale)
        assert values.max() < 1e-9
    # Off the set: stationarity > 0, and each point's own weighted sum l f1 + (1 - l) f2 (l = (x1 + 7)/14, scale 1)
    # is larger above and below it: the set is where those weighted sums are least.
    on = torch.from_numpy(curve[::50])
    lam = (on[:, 0] + 7) / 14

    def weighted(x: torch.Tensor) -> torch.Tensor:
        f = objectives(x, 1.0)
        return lam * f[:, 0] + (1 - lam) * f[:, 1]

    for shift in (0.3, -0.3):
        off = on + torch.tensor([0.0, shift], dtype=torch.float64)
        assert (stationarity(off) > 1e-4).all()  # the slope in x2 is small (0.01 (x2 + 8)^2): 1e-3 at 0.3 off
        assert (weighted(off) > weighted(on)).all()


def test_stationarity_at_the_origin_uses_the_papers_clamp_gradient():
    # At (0, 0) both clamps sit at their bound: with gradient 1 there (the papers' torch), d c1/dx2 = 1/2 and
    # d c2/dx2 = -1/2, so grad f2 = (0, (log 3.5 + 6 + 14.46)/2) and grad f1 = 0.1 grad f2: the min-norm element
    # is grad f1.
    want = 0.1 * (math.log(3.5) + 6 + 14.46) / 2
    assert stationarity(torch.zeros(1, 2, dtype=torch.float64), 0.1).item() == pytest.approx(want, rel=1e-12)


def test_metrics_through_evaluate():
    toy = CAGradToy(scale=0.1)
    model = DecisionVariables(toy.input_shape, {t.name: t.out_dim for t in toy.tasks}, init=[0.0, -8.0])
    metrics = evaluate(model, toy.tasks, toy.test, torch.device("cpu"))
    f1, f2 = closed_form(0.0, -8.0, 0.1)
    assert metrics["f1"]["value"] == pytest.approx(f1, rel=1e-6) and metrics["f1"]["loss"] == metrics["f1"]["value"]
    assert metrics["f2"]["value"] == pytest.approx(f2, rel=1e-6)
    assert metrics["f1"]["pareto_dist"] == pytest.approx(0.35511, abs=1e-4)  # straight down onto (0, -8.35511)
    assert metrics["f1"]["stationarity"] > 0 and set(metrics["f2"]) == {"loss", "value"}


def test_config_builds_and_refuses_a_bad_scale(compose_cfg):
    built = build("tasks", compose_cfg("tasks=cagrad_toy").tasks, TaskSet)
    assert type(built) is CAGradToy and built.task_names == ["f1", "f2"] and built.scale == 0.1
    with pytest.raises(ValueError, match=r"^scale: must be a finite number > 0, got 0$"):
        CAGradToy(scale=0)
    with pytest.raises(ValueError, match=r"^n_val: must be an integer > 0, got 0$"):
        CAGradToy(n_val=0)


def test_ls_through_the_engine_equals_a_hand_written_adam_loop():
    steps, lr, beta1, beta2, eps = 40, 1e-3, 0.9, 0.999, 1e-8
    ours = engine_trajectory(["balancer=fixed", "model.init=[-8.5,7.5]", "tasks.scale=1.0"], steps)
    x, m, v = np.array([-8.5, 7.5]), np.zeros(2), np.zeros(2)
    hand = [x.copy()]
    for t in range(1, steps + 1):
        g = closed_form_gradient(*x)
        m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
        x = x - lr * (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps)
        hand.append(x.copy())
    np.testing.assert_allclose(ours, np.array(hand), rtol=0, atol=1e-5)
    assert np.abs(ours[-1] - ours[0]).max() > 0.03  # it moved: 40 steps of about lr each
