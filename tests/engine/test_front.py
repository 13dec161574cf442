"""A front run (`model/front=<option>`): it builds with every balancer that draws a preference and refuses the
others in one line; the model sees the balancer's preference each step; metrics.json holds every ray."""

from __future__ import annotations

import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mtl_bench.catalog import conf_root
from mtl_bench.engine.compose import build_parts, finalise_config
from mtl_bench.engine.front_evaluation import front_run, preference_balancers, simplex_rays
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError
from mtl_bench.models.fronts import PreferenceModel

FRONTS = sorted(p.stem for p in (conf_root() / "model" / "front").glob("*.yaml"))
DRAWS = ["cosmos", "linear", "pbi", "stch"]


def test_the_balancers_that_draw_a_preference_are_found_from_their_classes():
    assert preference_balancers() == DRAWS


def built(small_conf, *overrides: str):
    cfg = small_conf(*overrides)
    finalise_config(cfg, list(overrides))
    conf = __import__("omegaconf").OmegaConf.to_object(cfg.trainer)
    parts = build_parts(cfg, conf, torch.device("cpu"))
    return cfg, conf, parts


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize("balancer", DRAWS)
def test_every_front_composes_with_every_balancer_that_draws_a_preference(small_conf, front, balancer):
    cfg, conf, parts = built(
        small_conf, f"model/front={front}", f"balancer={balancer}", "balancer.preference=dirichlet"
    )
    assert isinstance(parts.model, PreferenceModel)
    run = front_run(parts.model, parts.balancer, cfg, conf, parts.taskset.task_names)
    assert run is not None
    # The model sees this step's preference: the one the balancer reports weighing the losses by.
    x, _ = next(iter(torch.utils.data.DataLoader(parts.taskset.train, batch_size=8)))
    for _ in range(3):
        run.before_step()
        out = parts.model(x)
        losses = {t: out.preds[t].float().pow(2).mean() for t in parts.taskset.task_names}
        measured = parts.balancer.backward(losses, out.shared)
        seen = torch.stack([measured[f"preference/{t}"] for t in parts.taskset.task_names])
        assert torch.equal(parts.model.preference, seen)
        parts.balancer.step(torch.tensor(False))


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize("balancer", ["fixed", "rlw", "gradnorm", "mgda"])
def test_every_front_refuses_a_balancer_that_draws_no_preference_in_one_line(small_conf, front, balancer):
    with pytest.raises(ConfigError) as err:
        built(small_conf, f"model/front={front}", f"balancer={balancer}")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"balancer: model/front={'PaMaL' if front == 'pamal' else front.upper()}")
    assert "balancer=cosmos|linear|pbi|stch with balancer.preference=dirichlet" in message


def test_a_fixed_preference_and_front_keys_without_a_front_are_refused(small_conf):
    with pytest.raises(ConfigError, match=r"^balancer.preference: model/front=COSMOS needs a new preference each step"):
        built(small_conf, "model/front=cosmos", "balancer=linear")
    with pytest.raises(ConfigError, match=r"^trainer.front: evaluates a preference-conditioned model"):
        built(small_conf, "trainer.front.rays=3")
    with pytest.raises(ConfigError, match=r"^model.front.trunk_layers: must be null or 0..2"):
        built(
            small_conf,
            "model/front=phn",
            "model.front.trunk_layers=5",
            "balancer=linear",
            "balancer.preference=dirichlet",
        )
    with pytest.raises(ConfigError, match=r"^model.front.nonsense: not an option of mtl_bench.models.fronts.PaMaL"):
        built(small_conf, "model/front=pamal", "+model.front.nonsense=1")


def test_rays_spread_on_the_simplex():
    assert simplex_rays(3, 2) == [[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]]
    thirds = simplex_rays(10, 3)
    assert len(thirds) == 10 and {tuple(round(3 * x) for x in r) for r in thirds} == {
        (a, b, 3 - a - b) for a in range(4) for b in range(4 - a)
    }
    five = simplex_rays(5, 3)
    assert len(five) == 5 and all(abs(sum(r) - 1) < 1e-9 and min(r) >= 0 for r in five)
    assert [1.0, 0.0, 0.0] in five and [0.0, 0.0, 1.0] in five  # the corners kept


@pytest.mark.parametrize("front", FRONTS)
def test_a_front_runs_metrics_json_holds_every_ray(small_conf, tmp_path, front):
    overrides = [
        f"model/front={front}", "balancer=cosmos", "balancer.preference=dirichlet", "trainer.front.rays=3",
        "trainer.front.preferences=[[1,3],{t0: 0.9, t1: 0.1}]", "+tasks.front_reference={t0: 1.0e9, t1: 1.0e9}",
    ]  # fmt: skip
    train(small_conf(*overrides), tmp_path)
    record = json.loads((tmp_path / "metrics.json").read_text())
    front_record = record["front"]
    assert front_record["rays"] == [[0.0, 1.0], [0.5, 0.5], [1.0, 0.0], [0.25, 0.75], [0.9, 0.1]]
    for split in ("val", "test"):
        assert len(front_record[split]) == 5
        assert all(set(m) == {"t0", "t1"} and "loss" in m["t0"] for m in front_record[split])
        assert front_record[f"{split}_indicators"]["hypervolume"] > 0
    # The run's own metrics are the model's at the simplex's centre, the second ray.
    assert record["test"]["t0"]["loss"] == pytest.approx(front_record["test"][1]["t0"]["loss"], rel=1e-6)
    # The rays' models differ (the preference reaches the predictions).
    assert front_record["test"][0]["t0"]["loss"] != front_record["test"][2]["t0"]["loss"]
    # TensorBoard: the val front's picture and hypervolume at each evaluation (trainer=smoke: steps 10 and 20).
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    assert [e.step for e in events.Images("front/val")] == [10, 20]
    assert [e.step for e in events.Scalars("front/val/hypervolume")] == [10, 20]


def test_a_resumed_front_run_ends_as_the_uninterrupted_one(small_conf, tmp_path):
    """The preference is not in the model's checkpoint: the balancer's (and its generator) is, and the engine sets it
    before each step, so stopping at step 10 and resuming to 20 gives the uninterrupted run's front."""
    front = ["model/front=pamal", "balancer=linear", "balancer.preference=dirichlet", "trainer.front.rays=3"]
    whole = train(small_conf(*front), tmp_path / "whole")
    train(small_conf(*front, "trainer.max_steps=10"), tmp_path / "resumed")
    resumed = train(small_conf(*front, "trainer.resume=auto"), tmp_path / "resumed")
    assert resumed.test == whole.test
    fronts = [json.loads((tmp_path / d / "metrics.json").read_text())["front"]["test"] for d in ("whole", "resumed")]
    assert fronts[0] == fronts[1]
