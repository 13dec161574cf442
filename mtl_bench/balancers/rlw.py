"""Lin et al., TMLR 2022, "Reasonable Effectiveness of Random Weighting: A Litmus Test for Multi-Task Learning"."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.checks import number, one_of
from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.seeded import SeededGenerator
from mtl_bench.gradient_engine.loss_weighting_balancer import LossWeightingBalancer

DISTRIBUTIONS = ("normal", "uniform", "dirichlet", "bernoulli")


class RandomWeighting(LossWeighting):
    """Each optimizer step trains on Σ_i w_i L_i with fresh random weights: w = softmax(λ), λ_i ~ N(0, 1).

    `distribution` picks λ as LibMTL 1.1.5's `dist` does: normal (the paper's default, LibMTL main's only
    one), uniform on [0, 1), dirichlet (concentration 1), each through the softmax; bernoulli (p = 1/2,
    redrawn while all are 0) is used as drawn, without the softmax.

    The draws come from a CPU `torch.Generator` seeded with `seed`, kept in `state_dict` (its state is
    the extra state of its `rng` module), so a resumed run draws what the uninterrupted one would, every DDP rank
    draws the same weights without communicating, and CPU and GPU runs agree. The generator is torch's
    CPU generator, so with `seed` s the weights equal LibMTL's after `torch.manual_seed(s)` when nothing
    else draws from the global generator in between.

    The weights of a step are drawn one step ahead (on the host, while the device works) and held in the
    `weights` buffer; a step commits the next draw. A skipped step keeps `weights`, so the retried step
    uses the same weights; its draw is dropped (the generator still advances: rewinding it would need a
    host read of the device-side skip flag). Per-task mode and accumulation use one draw per optimizer step,
    as LibMTL draws once per batch.

    Reference: LibMTL 1.1.5 `LibMTL.weighting.RLW` (main: normal only). Metrics: `weight/<task>`.
    """

    weights: Tensor
    per_task = True  # one draw for every task of the step
    reads_losses = False

    def __init__(self, tasks: int, seed: int, distribution: str) -> None:
        """Options as `RandomLossWeighting`'s, checked there; `tasks`: their number."""
        super().__init__()
        self.tasks, self.distribution = tasks, distribution
        self.rng = SeededGenerator(seed)
        self.register_buffer("weights", self._draw())

    def extra_repr(self) -> str:
        return f"seed={self.rng.seed}, distribution={self.distribution}"

    def _draw(self) -> Tensor:
        """The next weights, drawn on the CPU (as LibMTL draws them), float32."""
        n, g = self.tasks, self.rng.generator
        if self.distribution == "bernoulli":
            while True:  # LibMTL redraws an all-zero sample; a CPU tensor, so no device sync
                sample = torch.bernoulli(torch.full((n,), 0.5), generator=g)
                if sample.sum() != 0:
                    return sample
        if self.distribution == "normal":
            sample = torch.randn(n, generator=g)
        elif self.distribution == "uniform":
            sample = torch.rand(n, generator=g)
        else:
            sample = torch._sample_dirichlet(torch.ones(n), generator=g)
        return torch.softmax(sample, dim=-1)

    def forward(self, losses: Tensor) -> Tensor:
        return self.weights.clone()  # this step's draw (the buffer takes the next one at the commit)

    def update(self, losses: Tensor, items: Tensor) -> dict[str, Tensor]:
        """The next step's weights: one draw per optimizer step."""
        draw = self._draw()
        if self.weights.device.type == "cuda":  # pinned, so the copy does not wait for the device
            draw = draw.pin_memory()
        return {"weights": draw.to(self.weights.device, non_blocking=True)}


class RandomLossWeighting(LossWeightingBalancer):
    """RLW (`RandomWeighting`) as a balancer: `balancer=rlw`."""

    def __init__(self, task_names: Sequence[str], seed: int = 0, distribution: str = "normal") -> None:
        """
        task_names: the tasks (given by the engine).
        seed: the seed of the balancer's own random generator (the run's seed by default in the config).
        distribution: what λ is drawn from: normal, uniform, dirichlet (then w = softmax(λ)) or bernoulli (w = λ).
        """
        distribution = one_of("distribution", distribution, DISTRIBUTIONS)
        weighting = RandomWeighting(len(task_names), number("seed", seed, integer=True), distribution)
        super().__init__(task_names, weighting)
