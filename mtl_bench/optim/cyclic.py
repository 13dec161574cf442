"""Cyclic lr and momentum per iteration: mmcv's CyclicLrUpdaterHook and CyclicMomentumUpdaterHook (gamma=1)."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch


def anneal(start: float, end: float, fraction: float, strategy: str) -> float:
    """mmcv annealing_cos / annealing_linear: `start` at fraction 0, `end` at fraction 1."""
    if strategy == "cos":
        return end + 0.5 * (start - end) * (math.cos(math.pi * fraction) + 1)
    return start + (end - start) * fraction


class CyclicSchedule:
    """Each of `cyclic_times` cycles over `total_steps` iterations has two phases: over the first
    `step_ratio_up` of the cycle the lr goes from its base value to base*target_ratio[0], then to
    base*target_ratio[1]. Momentum (SGD `momentum`, Adam-type `betas[0]`) follows the same phases between
    base*momentum_target_ratio[0] and base*momentum_target_ratio[1] (None: momentum stays fixed).

    Ratios are relative to the values the optimizer was built with, kept in each group as `initial_lr` and
    `initial_momentum`. Unlike mmcv, iterations past the last full cycle keep the end values instead of
    starting a new cycle (mmcv wraps around when total_steps is not a multiple of cyclic_times).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        target_ratio: tuple[float, float] = (10, 1e-4),
        cyclic_times: int = 1,
        step_ratio_up: float = 0.4,
        anneal_strategy: str = "cos",
        momentum_target_ratio: Optional[tuple[float, float]] = (0.85 / 0.95, 1.0),
    ) -> None:
        """
        optimizer: the optimizer (given by the engine).
        total_steps: the run's optimizer steps (given by the engine).
        target_ratio: [up, end]: the lr rises to lr×up, then falls to lr×end (both > 0).
        cyclic_times: cycles over the run (> 0).
        step_ratio_up: the rising part of each cycle, 0 < x < 1.
        anneal_strategy: cos or linear.
        momentum_target_ratio: momentum (SGD momentum, Adam beta1) moves the other way between these two
            ratios; null keeps it fixed.
        """
        if len(target_ratio) != 2 or not all(r > 0 for r in target_ratio):
            raise ValueError(f"target_ratio: need two positive ratios [up, end], got {list(target_ratio)}")
        if not cyclic_times > 0:
            raise ValueError(f"cyclic_times: must be > 0, got {cyclic_times}")
        if not 0 < step_ratio_up < 1:
            raise ValueError(f"step_ratio_up: must be in (0, 1), got {step_ratio_up}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy: {anneal_strategy!r} is not one of cos, linear")
        if momentum_target_ratio is not None and len(momentum_target_ratio) != 2:
            raise ValueError(f"momentum_target_ratio: need null or two ratios, got {momentum_target_ratio}")
        target_ratio = (float(target_ratio[0]), float(target_ratio[1]))
        if momentum_target_ratio is not None:
            momentum_target_ratio = (float(momentum_target_ratio[0]), float(momentum_target_ratio[1]))
        self.optimizer = optimizer
        self.period = max(1, total_steps // cyclic_times)
        self.steps_up = int(step_ratio_up * self.period)
        self.last_step = self.period * cyclic_times - 1
        self.target_ratio = target_ratio
        self.momentum_target_ratio = momentum_target_ratio
        self.sets_momentum = momentum_target_ratio is not None  # the engine logs momentum/<group> only then
        self.anneal_strategy = anneal_strategy
        self.iteration = 0
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
            if momentum_target_ratio is not None and group_momentum(group) is not None:
                group.setdefault("initial_momentum", group_momentum(group))
        self._apply()

    def ratio(self, iteration: int, targets: tuple[float, float]) -> float:
        """The factor on the base value at `iteration` (0-based optimizer steps)."""
        within = min(iteration, self.last_step) % self.period
        if within < self.steps_up:
            return anneal(1.0, targets[0], within / self.steps_up, self.anneal_strategy)
        return anneal(
            targets[0], targets[1], (within - self.steps_up) / (self.period - self.steps_up), self.anneal_strategy
        )

    def _apply(self) -> None:
        lr_ratio = self.ratio(self.iteration, self.target_ratio)
        m_ratio = self.ratio(self.iteration, self.momentum_target_ratio) if self.momentum_target_ratio else None
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lr_ratio
            if m_ratio is not None and "initial_momentum" in group:
                _set_momentum(group, group["initial_momentum"] * m_ratio)

    def step(self) -> None:
        """Call after each optimizer step: sets the values for the next one."""
        self.iteration += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iteration = int(state["iteration"])
        self._apply()


def group_momentum(group: dict[str, Any]) -> Optional[float]:
    """A param group's momentum: Adam-type betas[0], else SGD-type momentum; None when it has neither."""
    if "betas" in group:
        return group["betas"][0]
    return group.get("momentum")


def _set_momentum(group: dict[str, Any], value: float) -> None:
    if "betas" in group:
        group["betas"] = (value, *group["betas"][1:])
    else:
        group["momentum"] = value
