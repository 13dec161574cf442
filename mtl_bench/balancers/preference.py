"""Ruchte & Grabocka, ICDM 2021, "Scalable Pareto Front Approximation for Deep Multi-Objective Learning" (the draw)."""

from __future__ import annotations

from typing import Mapping, Sequence, Union

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.checks import number
from mtl_bench.balancers.scalarization import preference_vector
from mtl_bench.balancers.seeded import SeededGenerator
from mtl_bench.gradient_engine.balancer import Context
from mtl_bench.gradient_engine.loss_weighting_balancer import (
    no_per_task_mode,
    objective_weights,
    rank_mean_losses,
    weighted_backward,
)
from mtl_bench.gradient_engine.staged import JOINT, StagedBalancer

DIRICHLET = "dirichlet"

Preference = Union[str, Mapping[str, float], None]
Concentration = Union[float, Mapping[str, float], None]


def concentration(alpha: Concentration, default: float, task_names: Sequence[str]) -> list[float]:
    """The Dirichlet concentration in task order: one number > 0 for every task, or one per task by name."""
    if alpha is None:
        alpha = default
    if isinstance(alpha, Mapping):
        if set(alpha) != set(task_names):
            raise ValueError(f"alpha: tasks {sorted(alpha)} do not match the task set's tasks {list(task_names)}")
        values = [alpha[name] for name in task_names]
    elif isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
        values = [alpha] * len(task_names)
    else:
        raise ValueError(f"alpha: must be a number > 0 or {{task: number > 0}}, got {alpha!r}")
    return [number(f"alpha.{name}", value, 0, above=True, finite=True) for name, value in zip(task_names, values)]


class PreferenceScalarization(StagedBalancer):
    """A scalarization f(L; r) whose preference r is fixed by config or drawn anew each optimizer step.

    `preference`: a {task: r_i} mapping or None (1/T each) trains one trade-off, r fixed for the run;
    `dirichlet` draws r ~ Dir(alpha) for every optimizer step, as Pareto-front learning trains (COSMOS's code,
    `np.random.dirichlet(alpha)` once per batch), so one run covers the front. `alpha` is a number (the same
    concentration for every task) or {task: number}; 1 is uniform on the simplex, below 1 spreads the draws
    toward its corners.

    The draws come from a CPU `torch.Generator` seeded with `seed` and kept in `state_dict` (RLW's scheme):
    a resumed run draws what the uninterrupted one would, and every DDP rank draws the same r without
    communicating (tasks in sorted name order, so the config's order does not matter). Each step's r is
    drawn one step ahead into the `pref` buffer and committed by `step()`; a skipped step keeps r for its
    retry (the generator still advances: rewinding it would need a host read of the skip flag). Under
    accumulation the k micro-batches share the step's r.

    Metrics with `dirichlet`: `preference/<task>` (the step's r_i), besides `weight/<task>`.
    """

    pref: Tensor
    DEFAULT_ALPHA = 1.0

    def __init__(self, task_names: Sequence[str], preference: Preference, alpha: Concentration, seed: int) -> None:
        super().__init__(task_names)
        number("seed", seed, integer=True)
        self.draws = preference == DIRICHLET
        if isinstance(preference, str) and not self.draws:
            raise ValueError(f"preference: {preference!r} is not {DIRICHLET!r}, a {{task: weight >= 0}} or null")
        if not self.draws and alpha is not None:
            raise ValueError(f"alpha: the Dirichlet concentration needs preference: {DIRICHLET}, got {alpha!r}")
        self.rng = SeededGenerator(seed)
        if self.draws:
            self.alpha = concentration(alpha, self.DEFAULT_ALPHA, self.task_names)
            self._alpha = torch.tensor(self.alpha)  # float32, on the CPU like the generator
            self.register_buffer("pref", self._draw())
        else:
            assert not isinstance(preference, str)
            self.register_buffer("pref", preference_vector(preference, self.task_names))

    def extra_repr(self) -> str:
        if not self.draws:
            return f"tasks={self.task_names}, preference={self.pref.tolist()}"
        return f"tasks={self.task_names}, preference={DIRICHLET}, alpha={self.alpha}, seed={self.rng.seed}"

    def _draw(self) -> Tensor:
        return torch._sample_dirichlet(self._alpha, generator=self.rng.generator)

    def _next(self) -> None:
        """Stage the next step's r, once per optimizer step."""
        if "pref" in self._pending:
            return
        draw = self._draw()
        if self.pref.device.type == "cuda":  # pinned, so the copy does not wait for the device
            draw = draw.pin_memory()
        self._stage(pref=draw.to(self.pref.device, non_blocking=True))

    def _objective(self, losses: Tensor) -> Tensor:
        """f(L; r), a differentiable 0-d tensor of the (T,) losses."""
        raise NotImplementedError

    def per_task_problem(self) -> str:
        return no_per_task_mode(self)

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        self.check_losses(losses)
        ordered = {name: losses[name] for name in self.task_names}
        if not self.draws:
            return weighted_backward(self, ordered, objective_weights(self._objective, rank_mean_losses(ordered)), ctx)
        self._begin(JOINT, ctx, shared)
        pref = self.pref.clone()  # this step's r: a commit overwrites the buffer
        self._next()
        metrics = weighted_backward(self, ordered, objective_weights(self._objective, rank_mean_losses(ordered)), ctx)
        self._end_joint()
        return metrics | {tags.preference(name): pref[i] for i, name in enumerate(self.task_names)}
