"""TensorBoard tidy: HParams holds the chosen options and their values only, the gradient-cosine heatmap is
labelled and has a colour scale, one custom-scalars layout per task set."""

from __future__ import annotations

import numpy as np
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from mtl_bench.engine.diagnostics import colour, heatmap
from mtl_bench.loggers.hparams import hparam_values
from mtl_bench.loggers.tensorboard import dashboard_layout


def composed(*overrides: str) -> tuple[dict, dict]:
    with initialize_config_module("conf", version_base=None):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    config = OmegaConf.to_container(cfg, resolve=False)
    config.pop("hydra")  # type: ignore[union-attr]
    return OmegaConf.to_container(OmegaConf.create(config), resolve=True), choices  # type: ignore[return-value]


def test_hparams_are_the_options_and_their_values_without_hydra_internals():
    config, choices = composed("balancer=gradnorm", "balancer.alpha=1.5")
    values = hparam_values({**config, "hydra": {"run": {"dir": "x"}}}, choices)
    assert values["balancer"] == "gradnorm" and values["balancer.alpha"] == 1.5
    assert values["optim"] == "adam" and values["tasks"] == "toy" and "seed" in values
    assert not [k for k in values if "_target_" in k or "_partial_" in k or k.startswith("hydra")]
    assert not [k for k in values if k.startswith("tasks.reference")]
    assert not [k for k in values if k.split(".")[0] == "logger"]  # where the run logs is no hyper-parameter
    assert all(isinstance(v, (bool, int, float, str)) for v in values.values())  # what HParams accepts


def pixel(image: np.ndarray, x: int, y: int) -> np.ndarray:
    return image[:, y, x]


def test_heatmap_is_labelled_big_and_has_a_colour_scale():
    cos = np.array([[1.0, -0.8], [-0.8, 1.0]])
    image = heatmap(cos, ["segmentation", "depth"])
    assert image.shape[0] == 3 and image.dtype == np.float32 and 0 <= image.min() and image.max() <= 1
    assert min(image.shape[1:]) >= 150 and max(image.shape[1:]) > 160  # was 32 x 32 for two tasks
    relabelled = heatmap(cos, ["a", "b"])
    assert image.shape != relabelled.shape or not np.array_equal(image, relabelled)  # the names are drawn
    # the squares: find the grid by colour; an off-diagonal square (-0.8) is blue, a diagonal one (+1) red
    red, blue = colour(np.array(1.0)), colour(np.array(-0.8))
    rgb = image.transpose(1, 2, 0)
    assert (np.abs(rgb - red).max(axis=2) < 0.01).sum() > 2 * 30 * 30 * 0.5
    assert (np.abs(rgb - blue).max(axis=2) < 0.01).sum() > 2 * 30 * 30 * 0.5
    # the colour scale on the right: a column whose top is red and bottom blue
    right = rgb[:, -80:]
    tops = [c for c in range(right.shape[1]) if np.allclose(right[:, c][right[:, c].min(axis=1) < 0.99][:1], red)]
    assert tops, "no colour bar"


def test_heatmap_of_many_tasks_stays_readable_and_never_mislabels():
    image = heatmap(np.eye(40), [f"attr{i}" for i in range(40)])
    assert max(image.shape[1:]) < 1200
    assert heatmap(np.eye(3), ["a", "b"]).shape == heatmap(np.eye(3)).shape  # wrong count: indices, not wrong names


def merged_layout(*layouts: dict) -> dict[str, list[str]]:
    """What TensorBoard's custom-scalars plugin shows for several runs: categories merged by title, charts that
    differ appended (tensorboard/plugins/custom_scalar/custom_scalars_plugin.py, layout_impl)."""
    merged: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for layout in layouts:
        for category, charts in layout.items():
            seen = merged.setdefault(category, [])
            seen += [c for c in ((t, tuple(p)) for t, (_, p) in charts.items()) if c not in seen]
    return {category: [title for title, _ in charts] for category, charts in merged.items()}


TAGS = ["loss/{}", "weight/{}"]


def layout(task_set: str, tasks: list[str], extra: tuple[str, ...] = ()) -> dict:
    tags = [t.format(task) for t in (*TAGS, *extra) for task in tasks]
    return dashboard_layout({task: ["loss", "mse"] for task in tasks}, tags, task_set=task_set)


def test_one_layout_per_task_set_and_no_repeated_charts():
    """Two balancers on the toy task set and one run of NYUv2 under one logdir: each task set has its own
    categories, and no chart is shown twice within a category (before: "loss (all tasks)" three times)."""
    toy_fixed = layout("toy", ["t0", "t1"])
    toy_gradnorm = layout("toy", ["t0", "t1"], ("ratio/{}",))
    nyu = layout("nyuv2", ["segmentation", "depth", "normal"])
    merged = merged_layout(toy_fixed, toy_gradnorm, nyu)
    for category, titles in merged.items():
        assert len(titles) == len(set(titles)), (category, titles)
    assert [c for c in merged if c.endswith(": tasks")] == ["toy: tasks", "nyuv2: tasks"]
    assert merged["toy: tasks"] == ["loss (all tasks)", "weight (all tasks)", "ratio (all tasks)"]
    unnamed = dashboard_layout({"a": ["loss"], "b": ["loss"]}, ["loss/a", "loss/b"])  # no task set given
    assert "a+b: tasks" in unnamed
