"""The CAGrad/Nash-MTL/FAMO toy (tasks=cagrad_toy) run through the engine, and the papers' settings of it: what
scripts/toy_reference_check.py and scripts/known_answers_toy.py share."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from benchmarks.runs import recipe, recipe_step

# Each paper's starting points (their toy scripts' `inits`).
NASH_STARTS = ((-8.5, 7.5), (0.0, 0.0), (9.0, 9.0), (-7.5, -0.5), (9.0, -1.0))  # Nash-MTL and FAMO
CAGRAD_STARTS = ((-8.5, 7.5), (-8.5, -5.0), (9.0, 9.0))  # CAGrad's toy.py


def start_override(start: Sequence[float]) -> str:
    return f"model.init=[{float(start[0])},{float(start[1])}]"


def engine_trajectory(overrides: Sequence[str], steps: int, run_dir: Optional[Path] = None) -> np.ndarray:
    """(steps + 1, 2): x before the first step and after each of `steps` optimizer steps of
    `mtl-bench train experiment=cagrad_toy <overrides>` (the engine's own step, no logger)."""
    full = ["experiment=cagrad_toy", "logger=[]", f"trainer.max_steps={steps}", *overrides]
    with tempfile.TemporaryDirectory() as tmp:
        with recipe(full, Path(run_dir or tmp)) as run:
            (x,) = run.model.shared_parameters()
            points = [x.detach().clone()]
            for _ in range(steps):
                recipe_step(run)
                points.append(x.detach().clone())
    return torch.stack(points).double().numpy()
