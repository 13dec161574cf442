"""The options of the scalarizations (COSMOS, PBI, STCH, the linear one): a preference vector and a reference point,
in task order."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.checks import number, task_weights


def preference_vector(weights: Optional[Mapping[str, float]], task_names: Sequence[str]) -> Tensor:
    """A preference vector in task order: None gives 1/T each (the simplex's centre), else the given weights."""
    if weights is None:
        return torch.full((len(task_names),), 1.0 / len(task_names))
    try:
        values = task_weights(weights, list(task_names))
    except ValueError as error:  # its message names `weights`; here the option is `preference`
        raise ValueError(f"preference{str(error).removeprefix('weights')}") from None
    if not sum(values.values()) > 0:
        raise ValueError(f"preference: at least one weight must be > 0, got {dict(weights)}")
    return torch.tensor([values[name] for name in task_names], dtype=torch.float32)


def reference_point(point: Optional[Mapping[str, float]], task_names: Sequence[str]) -> Tensor:
    """A reference (ideal) point in task order: None gives 0 each; every task needs one finite number."""
    if point is None:
        return torch.zeros(len(task_names))
    if set(point) != set(task_names):
        raise ValueError(f"reference: tasks {sorted(point)} do not match the task set's tasks {list(task_names)}")
    values = {name: number(f"reference.{name}", value, finite=True) for name, value in point.items()}
    return torch.tensor([values[name] for name in task_names], dtype=torch.float32)
