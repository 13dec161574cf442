"""A method's own random generator, kept in its state_dict so resumed runs and DDP ranks draw the same."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from mtl_bench.balancers.checks import number


class SeededGenerator(nn.Module):
    """A CPU torch generator held by a method (`self.rng = SeededGenerator(seed)`, draws with `self.rng.generator`):
    seeded with `seed`, or from torch's global RNG when built (so ranks and resumed runs agree); its state is the
    module's extra state, so it is in the method's `state_dict` (under `rng.`)."""

    def __init__(self, seed: Optional[int]) -> None:
        super().__init__()
        self.seed = number("seed", seed, integer=True, null=True)
        self.generator = torch.Generator()
        self.generator.manual_seed(int(torch.randint(0, 2**62, ())) if seed is None else seed)

    def get_extra_state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def set_extra_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"].cpu())  # a checkpoint loaded onto a GPU moves it there

    def extra_repr(self) -> str:
        return f"seed={self.seed}"
