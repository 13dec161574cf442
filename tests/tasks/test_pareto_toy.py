"""tasks=pareto_toy (Lin et al. 2019's toy): the objectives by hand, the Pareto set and front in closed form, the
front's hypervolume, and runs measured against it: a front learner must spread its rays along the front (a model
that ignores the preference cannot), a separate linear scalarization must end at an end of the front."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from mtl_bench.api import run
from mtl_bench.tasks import ParetoToy
from mtl_bench.tasks.pareto_toy import front_point

pytest.importorskip("pymoo")
from mtl_bench.analysis.front_metrics import hypervolume, igd  # noqa: E402

ONE = torch.ones(1, 1)


def losses(taskset: ParetoToy, x: torch.Tensor) -> list[float]:
    target = torch.zeros(len(x), 1)
    return [float(task.loss(x, target)) for task in taskset.tasks]


def test_the_objectives_by_hand():
    toy = ParetoToy(dim=2, samples=1)
    a = 1 / math.sqrt(2)
    assert [t.name for t in toy.tasks] == ["f1", "f2"] and toy.input_shape == (1,)
    # x = 0: |x -/+ a|^2 = 1 for both; x = a: f1 = 0, |x + a|^2 = 4; x = (1, 0): |x - a|^2 = (1 - a)^2 + a^2.
    assert losses(toy, torch.zeros(1, 2)) == pytest.approx([1 - math.exp(-1)] * 2)
    assert losses(toy, torch.tensor([[a, a]])) == pytest.approx([0.0, 1 - math.exp(-4)])
    assert losses(toy, torch.tensor([[1.0, 0.0]]))[0] == pytest.approx(1 - math.exp(-((1 - a) ** 2 + a**2)))
    # metric "f": the batch's sum of the objective (the engine divides by the count)
    x = torch.tensor([[0.0, 0.0], [a, a]])
    sums = toy.tasks[0].metrics(x, torch.zeros(2, 1))["f"]
    assert float(sums) == pytest.approx(1 - math.exp(-1) + 0.0)
    with pytest.raises(ValueError, match="^dim: must be an integer >= 1"):
        ParetoToy(dim=0)


def gradients(toy: ParetoToy, x: torch.Tensor) -> list[torch.Tensor]:
    out = []
    for task in toy.tasks:
        point = x.clone().requires_grad_(True)
        task.loss(point, torch.zeros(1, 1)).backward()
        assert point.grad is not None
        out.append(point.grad[0])
    return out


@pytest.mark.parametrize("s", [-1.0, -0.5, 0.0, 0.3, 1.0])
def test_the_pareto_set_is_the_segment_and_its_losses_the_closed_form_front(s: float):
    toy = ParetoToy(dim=20, samples=1)
    a = torch.full((1, 20), 1 / math.sqrt(20))
    assert losses(toy, s * a) == pytest.approx(list(front_point(s)), abs=1e-6)
    g1, g2 = gradients(toy, s * a)
    if abs(s) < 1:  # inside the segment the two gradients point opposite ways: no direction improves both
        assert float(torch.nn.functional.cosine_similarity(g1, g2, dim=0)) == pytest.approx(-1.0, abs=1e-5)
    # off the segment (a step perpendicular to a, or beyond its end) a common descent direction exists
    off = s * a + 0.3 * torch.tensor([[1.0, -1.0] * 10]) / math.sqrt(20)
    g1, g2 = gradients(toy, off)
    assert float(torch.nn.functional.cosine_similarity(g1, g2, dim=0)) > -0.99
    g1, g2 = gradients(toy, 1.5 * a)
    assert float(torch.nn.functional.cosine_similarity(g1, g2, dim=0)) == pytest.approx(1.0, abs=1e-5)


def test_the_true_front_hypervolume_and_what_k_evenly_spaced_points_reach():
    # The continuous front's HV at (1, 1) by quadrature: the area under 1 - f2 as f1 runs along the front.
    s = torch.linspace(1, -1, 200_001, dtype=torch.float64)
    f1, f2 = 1 - torch.exp(-((1 - s) ** 2)), 1 - torch.exp(-((1 + s) ** 2))
    area = float(torch.trapezoid(1 - f2, f1)) + (1 - float(f1[-1]))
    assert area == pytest.approx(0.3421, abs=1e-4)
    assert hypervolume(ParetoToy.true_front(20_001), [1, 1]) == pytest.approx(area, rel=2e-4)
    assert hypervolume(ParetoToy.true_front(10), [1, 1]) / area == pytest.approx(0.84, abs=0.005)
    assert hypervolume(ParetoToy.true_front(25), [1, 1]) / area == pytest.approx(0.94, abs=0.005)
    assert ParetoToy.true_front(3) == [list(front_point(-1)), list(front_point(0)), list(front_point(1))]


def train(tmp_path: Path, name: str, *overrides: str) -> dict:
    logging.disable(logging.WARNING)
    try:
        run(["tasks=pareto_toy", "model=decision", "logger=csv", "trainer.num_threads=1", *overrides], tmp_path / name)
    finally:
        logging.disable(logging.NOTSET)
    return json.loads((tmp_path / name / "metrics.json").read_text())


def test_a_front_learner_spreads_its_rays_along_the_true_front_and_a_blind_model_cannot(tmp_path: Path):
    """COSMOS (x = MLP(1, r)) with PBI reaches 0.9 of what 10 evenly spaced true points reach in 300 steps (about
    1.0 in the table of docs/known_answers.md); the same run with x a plain parameter, which cannot read the r that
    COSMOS appends to the input, gives one point for every ray, and no single point reaches half of it."""
    bound = hypervolume(ParetoToy.true_front(10), [1, 1])
    best_single = max(hypervolume([p], [1, 1]) for p in ParetoToy.true_front(2001))
    assert best_single / bound < 0.5  # exp(-2) / 0.2876
    common = ["model/front=cosmos", "balancer=pbi", "balancer.preference=dirichlet", "optim.lr=0.001"]
    common += ["trainer.max_steps=300", "trainer.front.rays=10"]
    found = {}
    for name, model in (("cosmos", "model.hidden=[100]"), ("blind", "model.init_range=[-0.5,0.5]")):
        metrics = train(tmp_path, name, model, *common)
        truth = metrics["true_front"]
        assert truth["tasks"] == ["f1", "f2"] and truth["reference_point"] == [1.0, 1.0]
        assert truth["hypervolume"] == pytest.approx(0.3421, abs=1e-4)
        found[name] = [[m["f1"]["loss"], m["f2"]["loss"]] for m in metrics["front"]["test"]]
    assert hypervolume(found["cosmos"], [1, 1]) / bound > 0.9
    assert igd(found["cosmos"], truth["points"]) < 0.06  # 10 evenly spaced true points: 0.035
    assert hypervolume(found["blind"], [1, 1]) / bound < 0.5


def test_a_linear_scalarization_ends_at_an_end_of_the_front(tmp_path: Path):
    """The front is concave: Σ r_i f_i at an interior preference is minimised at an end (s = ±1), never inside."""
    metrics = train(
        tmp_path,
        "linear",
        "model.init_range=[-0.5,0.5]",
        "balancer=linear",
        "balancer.preference={f1: 0.4, f2: 0.6}",
        "optim.lr=0.01",
        "trainer.max_steps=200",
    )
    point = [metrics["test"]["f1"]["loss"], metrics["test"]["f2"]["loss"]]
    ends = [list(front_point(-1)), list(front_point(1))]
    assert min(math.dist(point, end) for end in ends) < 0.01
