"""A Gramian method from a user's own package (tests/fixtures/my_lab_project/my_lab/weightings.py, the code of
docs/library.md): the direction it writes by hand, its state committed and skipped, and a run from its config."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtl_bench.balancers import BackwardContext, GramianBalancer
from mtl_bench.engine.compose import finalise_config
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ContractError
from tests.helpers.balancer_kit import TASKS3, assert_state_is, batch, make_model, task_losses

PROJECT = Path(__file__).parents[1] / "fixtures" / "my_lab_project"


@pytest.fixture
def my_lab(monkeypatch):
    monkeypatch.syspath_prepend(str(PROJECT))
    yield __import__("my_lab.weightings").weightings
    for name in [n for n in sys.modules if n == "my_lab" or n.startswith("my_lab.")]:
        del sys.modules[name]


def per_task_grads(model, x, y) -> list[torch.Tensor]:
    params = list(model.trunk.parameters())
    grads = []
    for task in TASKS3:
        _, losses = task_losses(model, x, y)
        grads.append(torch.cat([g.flatten() for g in torch.autograd.grad(losses[task], params)]))
    return grads


def test_the_direction_is_the_smoothed_inverse_norm_sum(my_lab):
    model = make_model()
    bal = GramianBalancer(list(TASKS3), list(model.trunk.parameters()), my_lab.SmoothedInverseNorm(TASKS3, beta=0.5))
    scales = None
    for step in range(3):
        x, y = batch(seed=step)
        grads = per_task_grads(model, x, y)
        raw = torch.stack([1 / g.norm() for g in grads])
        scales = raw if scales is None else 0.5 * scales + 0.5 * raw
        model.zero_grad()
        out, losses = task_losses(model, x, y)
        metrics = bal.backward(losses, out.shared, BackwardContext())
        metrics |= bal.step()
        trunk = torch.cat([p.grad.flatten() for p in model.trunk.parameters()])
        torch.testing.assert_close(trunk, sum(s * g for s, g in zip(scales, grads)), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.stack([metrics[f"weight/{t}"] for t in TASKS3]), scales)
        torch.testing.assert_close(metrics["inverse_norm/raw_mean"], raw.mean())
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    assert set(bal.state_dict()) == {"weighting.scales", "weighting.started"}  # the weighting's state
    torch.testing.assert_close(bal.state_dict()["weighting.scales"], scales)
    before = copy.deepcopy(bal.state_dict())
    out, losses = task_losses(model, *batch(seed=9))
    bal.backward(losses, out.shared, BackwardContext())
    bal.step(torch.tensor(True))  # a skipped step: the staged scales are dropped
    assert_state_is(bal, before)


def test_a_checkpoint_with_the_weightings_state_under_flat_names_is_refused_in_one_line(my_lab):
    bal = GramianBalancer(
        TASKS3, list(torch.nn.Linear(2, 2).parameters()), weighting=my_lab.SmoothedInverseNorm(TASKS3)
    )
    flat = {key.removeprefix("weighting."): value for key, value in bal.state_dict().items()}
    with pytest.raises(ContractError, match=r"flat names \('scales'\).*start a new run") as err:
        bal.load_state_dict(flat)
    assert "\n" not in str(err.value)


def test_a_run_from_the_users_config_node(my_lab, compose_cfg, tmp_path):
    node = OmegaConf.load(PROJECT / "my_conf" / "balancer" / "my_weighting.yaml")
    overrides = ["model=mlp", "trainer=smoke", "trainer.num_threads=1"]
    cfg = compose_cfg(*overrides)
    cfg.balancer = node
    finalise_config(cfg, overrides)
    result = train(cfg, tmp_path / "run")
    assert result.step > 0
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)["balancer"]
    assert set(state) == {"weighting.scales", "weighting.started"}
    assert bool(state["weighting.started"]) and (state["weighting.scales"] > 0).all()


def test_docs_show_the_fixtures_code_in_at_most_40_lines():
    code = (PROJECT / "my_lab" / "weightings.py").read_text()
    assert code in (Path(__file__).parents[2] / "docs" / "library.md").read_text()
    assert len(code.splitlines()) <= 40
