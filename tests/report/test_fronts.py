"""Front metrics (pymoo's indicators) on hand-computed cases and against moocore's hypervolume, and the report's
fronts table and plot from a fixture sweep: front-model runs and a fixed-preference sweep (separate models)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mtl_bench.analysis.front_metrics import front_summary, hypervolume, igd, non_dominated, spacing
from mtl_bench.report.main import make_report
from tests.helpers.run_dirs import saved_run

pytest.importorskip("pymoo")


def test_hypervolume_of_a_two_task_staircase_by_hand():
    # Rectangles to the reference (4, 4): (1, 3) -> 3 x 1, (2, 2) -> 2 x 1 more, (3, 1) -> 1 x 1 more: 6. A dominated
    # point (3, 3) and one beyond the reference (5, 0) add nothing.
    assert hypervolume([[1, 3], [2, 2], [3, 1]], [4, 4]) == pytest.approx(6.0)
    assert hypervolume([[1, 3], [2, 2], [3, 1], [3, 3], [5, 0]], [4, 4]) == pytest.approx(6.0)
    assert hypervolume([[5, 5]], [4, 4]) == 0.0
    # Three tasks, two boxes to (4, 4, 4): 3x2x1 + 2x3x2 - their overlap from (2, 2, 3): 2x2x1, so 6 + 12 - 4.
    assert hypervolume([[1, 2, 3], [2, 1, 2]], [4, 4, 4]) == pytest.approx(14.0)


def test_hypervolume_equals_moocores():
    """pymoo's HV calls moocore; checked here on random fronts of 2 to 4 tasks, beyond the hand cases."""
    moocore = pytest.importorskip("moocore")
    rng = np.random.default_rng(0)
    for n, m in ((5, 2), (12, 3), (20, 4)):
        points = rng.uniform(0, 1, size=(n, m))
        assert hypervolume(points.tolist(), [1.1] * m) == pytest.approx(moocore.hypervolume(points, ref=[1.1] * m))


def test_igd_spacing_and_non_dominated_by_hand():
    # From each reference point to the nearest point: 0 and sqrt(2).
    assert igd([[0, 1]], [[0, 1], [1, 0]]) == pytest.approx(math.sqrt(2) / 2)
    assert spacing([[0, 2], [1, 1], [2, 0]]) == pytest.approx(0.0)  # evenly spaced
    assert non_dominated([[1, 3], [3, 3], [2, 2]]).tolist() == [[1, 3], [2, 2]]
    assert front_summary([[1, 3], [2, 2]], [4, 4]) == {"non_dominated": 2.0, "spacing": 0.0, "hypervolume": 5.0}


def write_run(
    root: Path, name: str, overrides: list[str], test: dict, front: list[dict] | None = None, steps: int = 100, **more
) -> None:
    run, cfg, choices = saved_run(root, name, overrides)
    metrics = {
        "status": "completed",
        "overrides": overrides,
        "choices": choices,
        "seed": cfg.seed,
        "step": steps,
        "wall_time_s": 1.0,
        "higher_is_better": {"t0": {"loss": False, "mse": False}, "t1": {"loss": False, "mse": False}},
        "val": test,
        "test": test,
        "initial_test": {"t0": {"loss": 9.0, "mse": 9.0}, "t1": {"loss": 9.0, "mse": 9.0}},
        **({"front": {"tasks": ["t0", "t1"], "test": front}} if front is not None else {}),
        **more,
    }
    (run / "metrics.json").write_text(json.dumps(metrics))


def losses(a: float, b: float) -> dict:
    return {"t0": {"loss": a, "mse": a}, "t1": {"loss": b, "mse": b}}


FRONT_POINTS = {0: [(1, 3), (2, 2), (3, 1)], 1: [(1, 3), (3, 1)]}  # hypervolumes 6 and 5 at (4, 4)
SEPARATE_POINTS = [(1.5, 3.5), (2.5, 2.5), (3.5, 1.5)]  # 1.25 + 1.5 + 0.5 = 3.25 at (4, 4), both seeds


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    common = ["+tasks.front_reference={t0: 4.0, t1: 4.0}", "balancer=linear"]
    for seed, points in FRONT_POINTS.items():
        overrides = [*common, "model/front=phn", "balancer.preference=dirichlet", f"seed={seed}"]
        # 300 steps: as many as the three separate runs of 100 steps (the IGD reference needs equal compute)
        write_run(tmp_path, f"phn_{seed}", overrides, losses(2, 2), [losses(a, b) for a, b in points], steps=300)
    for seed in (0, 1):
        for i, (a, b) in enumerate(SEPARATE_POINTS):
            preference = f"balancer.preference={{t0: {i / 2}, t1: {1 - i / 2}}}"
            write_run(tmp_path, f"sep_{seed}_{i}", [*common, preference, f"seed={seed}"], losses(a, b))
    return tmp_path


def test_the_report_shows_each_fronts_hypervolume_with_its_interval_and_plots_them(sweep: Path, tmp_path: Path):
    pytest.importorskip("matplotlib")
    text, written = make_report([sweep], "markdown", None, tmp_path / "plots")
    table = text[text.index("Fronts on tasks=toy") :]
    assert "hypervolume reference [4.0, 4.0]" in table
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines() if line.startswith("| ")}
    # 5.5 ± t(0.975, 1) * stdev(6, 5) / sqrt(2) = 12.706 * 0.5
    assert rows["phn + linear"][1] == "5.5 ± 6.4"
    assert rows["separate linear models"][1] == "3.25 ± 0"
    # IGD to the separate front: seed 0 sqrt(0.5) from each of its points; seed 1 (sqrt(.5) * 2 + sqrt(2.5)) / 3.
    igd_mean = (math.sqrt(0.5) + (2 * math.sqrt(0.5) + math.sqrt(2.5)) / 3) / 2
    assert rows["phn + linear"][2].startswith(f"{igd_mean:.4g} ± ")
    assert rows["phn + linear"][4:6] == ["2", "2/3"]  # seeds, points per front (the sizes seen)
    assert rows["separate linear models"][6].startswith("300")  # three runs of 100 steps per seed: equal compute
    plot = tmp_path / "plots" / "fronts_toy.png"
    assert plot in written and plot.stat().st_size > 0


def table_rows(text: str, task_set: str) -> dict[str, list[str]]:
    table = text[text.index(f"Fronts on tasks={task_set}") :]
    return {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines() if line.startswith("| ")}


def test_igd_is_measured_only_against_separate_models_of_the_same_model_and_steps(sweep: Path, tmp_path: Path):
    """Fixed-preference runs trained otherwise (a study's scalarization trials: other steps; another model) are no
    separate-model front for IGD: beside the sweep of equal compute they change nothing, alone they give none."""
    text, _ = make_report([sweep], "markdown", None, None)
    expected = table_rows(text, "toy")["phn + linear"][2]
    assert expected != "n/a"
    common = ["+tasks.front_reference={t0: 4.0, t1: 4.0}", "balancer=linear"]
    for seed in (0, 1):
        for i, (a, b) in enumerate([(0.5, 3.9), (3.9, 0.5)]):
            weights = f"balancer.preference={{t0: {i}, t1: {1 - i}}}"
            # tuning trials of 50 steps (100 per seed); a sweep of another model at the front's 300 steps per seed
            trial = [*common, weights, "optim.lr=0.01", f"seed={seed}"]
            write_run(tmp_path / "trials", f"{seed}_{i}", trial, losses(a, b), steps=50)
            other = [*common, weights, "model=decision", f"seed={seed}"]
            write_run(tmp_path / "other", f"{seed}_{i}", other, losses(a, b), steps=150)
    text, _ = make_report([sweep, tmp_path / "trials", tmp_path / "other"], "markdown", None, None)
    assert table_rows(text, "toy")["phn + linear"][2] == expected
    fronts = sorted(sweep.glob("phn_*"))
    for alone in ("trials", "other"):
        text, _ = make_report([*fronts, tmp_path / alone], "markdown", None, None)
        assert table_rows(text, "toy")["phn + linear"][2] == "n/a", alone


def test_a_known_front_gives_the_hypervolume_over_the_true_ones_and_the_igd_to_it(tmp_path: Path):
    # True front (0, 2), (1, 1), (2, 0) with reference (3, 3): HV 3 + 2 + 1 - ... = 6 (staircase 3x1 + 2x1 + 1x1).
    truth = {"tasks": ["t0", "t1"], "points": [[0, 2], [1, 1], [2, 0]], "reference_point": [3.0, 3.0]}
    truth["hypervolume"] = hypervolume(truth["points"], [3.0, 3.0])
    assert truth["hypervolume"] == pytest.approx(6.0)
    common = ["+tasks.front_reference={t0: 3.0, t1: 3.0}", "balancer=linear", "model/front=phn"]
    front = [losses(0, 2), losses(2, 0)]  # the ends: HV 3 + 3 - 1 = 5; IGD: (0 + sqrt(2) + 0) / 3
    write_run(tmp_path, "phn", [*common, "balancer.preference=dirichlet"], losses(1, 1), front, true_front=truth)
    text, _ = make_report([tmp_path], "markdown", None, None)
    header = text[text.index("Fronts on tasks=toy") :].splitlines()[2]
    assert "HV / true HV | IGD to true front" in header
    row = table_rows(text, "toy")["phn + linear"]
    assert row[1] == "5"
    assert row[2] == f"{5 / 6:.4g}"
    assert row[3] == f"{math.sqrt(2) / 3:.4g}"
