"""The decision variables of an optimisation problem as a model: no data, the parameters are the point x.

Problems with a known answer (tasks=pareto_toy, tasks=cagrad_toy) are written as task sets whose losses are the
objectives f_i(x); this model makes x a trainable parameter and gives every task the same x, so `mtl-bench train`
optimises the problem with any balancer exactly as it trains a network.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.base import MultiTaskModel


class Point(nn.Module):
    """x as one parameter; each input row gets the same x (the input's values are not read)."""

    def __init__(self, dim: int, init: Optional[Sequence[float]]) -> None:
        super().__init__()
        if init is None:
            self.x = nn.Parameter(torch.zeros(dim))
        else:
            self.x = nn.Parameter(torch.tensor([float(v) for v in init]))

    def forward(self, inputs: Tensor) -> Tensor:
        return self.x.expand(inputs.shape[0], -1)


class DecisionVariables(MultiTaskModel):
    """Trunk: the point x (`Point`); heads: identity, so every task's prediction is x itself."""

    def __init__(
        self,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        init: Optional[Sequence[float]] = None,
        arch: Any = None,
    ) -> None:
        """
        input_shape: one sample's shape (given by the engine from the task set; not read).
        heads: each task's output width (given by the engine): the dimension of x, the same for every task.
        init: the starting point x0 (one value per dimension); null: the origin.
        arch: must be null or hps (the point has no stages to wrap).
        """
        dims = sorted(set(heads.values()))
        if len(dims) != 1:
            raise ValueError(f"heads: every task must read the same x, got widths {dict(heads)}")
        dim = dims[0]
        if init is not None and len(init) != dim:
            raise ValueError(f"init: need {dim} values (the problem's dimension), got {len(init)}")
        point = Point(dim, init)
        super().__init__(point, {name: nn.Identity() for name in heads}, point, input_shape=input_shape, arch=arch)
