"""A balancer's own random generator, kept in its state_dict so resumed runs and DDP ranks draw the same."""

from __future__ import annotations

from typing import Optional

import torch

from mtl_bench.balancers.checks import number


class SeededGenerator:
    """The balancer's own torch generator (a mixin before the nn.Module base): seeded with `seed`, or from torch's
    global RNG when built (so ranks and resumed runs agree), its state in `state_dict`."""

    seed: Optional[int]
    generator: torch.Generator

    def _seed_generator(self, seed: Optional[int]) -> None:
        self.seed = number("seed", seed, integer=True, null=True)
        self.generator = torch.Generator()
        self.generator.manual_seed(int(torch.randint(0, 2**62, ())) if seed is None else seed)

    def get_extra_state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def set_extra_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"].cpu())  # a checkpoint loaded onto a GPU moves it there
