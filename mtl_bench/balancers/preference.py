"""Ruchte & Grabocka, ICDM 2021, "Scalable Pareto Front Approximation for Deep Multi-Objective Learning" (the draw)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from mtl_bench import tags
from mtl_bench.balancers.checks import number
from mtl_bench.balancers.scalarization import preference_vector
from mtl_bench.balancers.seeded import SeededGenerator

DIRICHLET = "dirichlet"

PreferenceOption = Union[str, Mapping[str, float], None]
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


class Preference(nn.Module):
    """A scalarization's preference r, held by its weighting (`self.preference = Preference(...)`), fixed by config
    or drawn anew each optimizer step.

    `preference`: a {task: r_i} mapping or None (1/T each) trains one trade-off, r fixed for the run;
    `dirichlet` draws r ~ Dir(alpha) for every optimizer step, as Pareto-front learning trains (COSMOS's code,
    `np.random.dirichlet(alpha)` once per batch), so one run covers the front. `alpha` is a number (the same
    concentration for every task) or {task: number}; 1 is uniform on the simplex, below 1 spreads the draws
    toward its corners.

    The draws come from a CPU `torch.Generator` seeded with `seed` and kept in `state_dict` (RLW's scheme, under
    `rng.`): a resumed run draws what the uninterrupted one would, and every DDP rank draws the same r without
    communicating (tasks in sorted name order, so the config's order does not matter). Each step's r is in the
    `pref` buffer; the next one is drawn by the weighting's `update` (`next()`, once per optimizer step) and
    committed by the balancer's `step()`: a skipped step keeps r for its retry (the generator still advances:
    rewinding it would need a host read of the skip flag). Under accumulation the k micro-batches share the step's r.

    Metrics with `dirichlet` (`metrics()`): `preference/<task>` (the step's r_i).
    """

    pref: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        preference: PreferenceOption,
        alpha: Concentration,
        seed: int,
        default_alpha: float = 1.0,
    ) -> None:
        """
        task_names: the tasks in the weighting's (sorted) order.
        preference, alpha, seed: the method's options of the same names.
        default_alpha: the concentration when `alpha` is null (the method's paper's).
        """
        super().__init__()
        self.task_names = list(task_names)
        number("seed", seed, integer=True)
        self.draws = preference == DIRICHLET
        if isinstance(preference, str) and not self.draws:
            raise ValueError(f"preference: {preference!r} is not {DIRICHLET!r}, a {{task: weight >= 0}} or null")
        if not self.draws and alpha is not None:
            raise ValueError(f"alpha: the Dirichlet concentration needs preference: {DIRICHLET}, got {alpha!r}")
        self.rng = SeededGenerator(seed)
        if self.draws:
            self.alpha = concentration(alpha, default_alpha, self.task_names)
            self._alpha = torch.tensor(self.alpha)  # float32, on the CPU like the generator
            self.register_buffer("pref", self._draw())
        else:
            assert not isinstance(preference, str)
            self.register_buffer("pref", preference_vector(preference, self.task_names))

    def extra_repr(self) -> str:
        if not self.draws:
            return f"preference={self.pref.tolist()}"
        return f"preference={DIRICHLET}, alpha={self.alpha}"  # the seed: its generator's repr

    def _draw(self) -> Tensor:
        return torch._sample_dirichlet(self._alpha, generator=self.rng.generator)

    def next(self) -> dict[str, Tensor]:
        """The next step's r as the new value of `pref` (for the weighting's update, once per optimizer step); {}
        for a fixed r."""
        if not self.draws:
            return {}
        draw = self._draw()
        if self.pref.device.type == "cuda":  # pinned, so the copy does not wait for the device
            draw = draw.pin_memory()
        return {"pref": draw.to(self.pref.device, non_blocking=True)}

    def metrics(self) -> dict[str, Tensor]:
        """`preference/<task>`: this step's r when it is drawn (a copy: the commit overwrites the buffer)."""
        if not self.draws:
            return {}
        pref = self.pref.clone()
        return {tags.preference(name): pref[i] for i, name in enumerate(self.task_names)}


def preference_of(balancer: nn.Module) -> Optional[Preference]:
    """The `Preference` a balancer's weighting holds (a preference scalarization's), or None."""
    weighting = getattr(balancer, "weighting", None)
    if not isinstance(weighting, nn.Module):
        return None
    return next((module for module in weighting.modules() if isinstance(module, Preference)), None)
