"""The decision variables of an optimisation problem as a model: no data, the parameters are the point x.

Problems with a known answer (tasks=pareto_toy, tasks=cagrad_toy) are written as task sets whose losses are the
objectives f_i(x); this model makes x a trainable parameter and gives every task the same x, so `mtl-bench train`
optimises the problem with any balancer exactly as it trains a network. With `hidden`, x is instead a small network's
output for the input, so a front learner that feeds the preference through the input (model/front=cosmos) can answer
each preference with its own x.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.base import MultiTaskModel


class Point(nn.Module):
    """x as one parameter; each input row gets the same x (the input's values are not read)."""

    def __init__(self, dim: int, init: Optional[Sequence[float]], init_range: Optional[Sequence[float]] = None) -> None:
        super().__init__()
        if init is not None:
            self.x = nn.Parameter(torch.tensor([float(v) for v in init]))
        elif init_range is not None:  # from the global generator, which the run's seed sets
            low, high = (float(v) for v in init_range)
            self.x = nn.Parameter(torch.rand(dim) * (high - low) + low)
        else:
            self.x = nn.Parameter(torch.zeros(dim))

    def forward(self, inputs: Tensor) -> Tensor:
        return self.x.expand(inputs.shape[0], -1)


def point_network(input_shape: Sequence[int], hidden: Sequence[int], dim: int) -> nn.Sequential:
    """x = MLP(input): Flatten, Linear + ReLU per hidden width, then Linear to the problem's dimension."""
    layers: list[nn.Module] = [nn.Flatten()]
    size = math.prod(input_shape)
    for width in hidden:
        layers += [nn.Linear(size, int(width)), nn.ReLU()]
        size = int(width)
    layers.append(nn.Linear(size, dim))
    return nn.Sequential(*layers)


class DecisionVariables(MultiTaskModel):
    """Trunk: the point x (`Point`), or x computed from the input (`hidden`); heads: identity, so every task's
    prediction is x itself."""

    def __init__(
        self,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        init: Optional[Sequence[float]] = None,
        init_range: Optional[Sequence[float]] = None,
        hidden: Optional[Sequence[int]] = None,
    ) -> None:
        """
        input_shape: one sample's shape (given by the engine from the task set).
        heads: each task's output width (given by the engine): the dimension of x, the same for every task.
        init: the starting point x0 (one value per dimension); null: the origin (or init_range).
        init_range: [low, high]: x0 drawn uniformly in the box, per coordinate, from the run's seed (Lin et al.'s
            toy: [-0.5, 0.5]); null: init.
        hidden: null: x is a parameter (the input is not read); [h1, ...]: x = MLP(input) with ReLU layers of these
            widths (at least one), for a front learner that appends the preference to the input (model/front=cosmos).
        """
        dims = sorted(set(heads.values()))
        if len(dims) != 1:
            raise ValueError(f"heads: every task must read the same x, got widths {dict(heads)}")
        dim = dims[0]
        if init is not None and len(init) != dim:
            raise ValueError(f"init: need {dim} values (the problem's dimension), got {len(init)}")
        if init_range is not None:
            if init is not None:
                raise ValueError("init_range: x0 is given by init already; set one of them")
            if len(init_range) != 2 or not float(init_range[0]) < float(init_range[1]):
                raise ValueError(f"init_range: must be [low, high] with low < high, got {list(init_range)}")
        trunk: nn.Module
        if hidden is not None:
            if init is not None or init_range is not None:
                raise ValueError("hidden: x is the network's output, so init and init_range must be null")
            if len(hidden) == 0 or not all(isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in hidden):
                raise ValueError(f"hidden: need at least one layer width, each an integer > 0, got {list(hidden)}")
            trunk = point_network(input_shape, hidden, dim)
            last = trunk[-1]
        else:
            trunk = last = Point(dim, init, init_range)
        super().__init__(trunk, {name: nn.Identity() for name in heads}, last, input_shape=input_shape)
