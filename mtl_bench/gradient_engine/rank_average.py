"""Cross-rank averaging of balancer statistics, matched by name, so every rank holds the same weights."""

from __future__ import annotations

import zlib
from typing import Mapping

import torch
import torch.distributed as dist
from torch import Tensor

_checked_names: set[tuple[str, ...]] = set()


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank_mean(value: Tensor) -> Tensor:
    """The mean over DDP ranks (every rank gets the same bits); unchanged on one process."""
    n = world_size()
    if n == 1:
        return value
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / n


def _check_same_names(names: tuple[str, ...], device: torch.device) -> None:
    """Once per set of names: every rank must reduce the same names (else the means would mix tasks)."""
    digest = zlib.crc32("\0".join(names).encode())
    both = torch.tensor([digest, -digest], dtype=torch.int64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    high, neg_low = both.tolist()  # host sync, but only the first time these names are reduced
    if high != digest or neg_low != -digest:
        raise RuntimeError(f"ranks reduce different statistics; this rank has {list(names)}")


def average_by_name(values: Mapping[str, Tensor], count: float = 1.0) -> dict[str, Tensor]:
    """Mean over ranks of each named 0-d statistic, weighted by `count` (this rank's batch size).

    The EnCodec seed matched values by position in a dict whose order could differ between ranks; here
    the names are sorted before packing, so the order is the same everywhere. One all_reduce for all.
    Without an initialized process group (or with one rank) the values come back unchanged.
    """
    if world_size() == 1 or not values:
        return dict(values)
    names = tuple(sorted(values))
    first = values[names[0]]
    if names not in _checked_names:
        _check_same_names(names, first.device)
        _checked_names.add(names)
    packed = (
        torch.stack(
            [values[name].detach().float().reshape(()) for name in names] + [torch.ones((), device=first.device)]
        )
        * count
    )
    dist.all_reduce(packed)
    mean = packed[:-1] / packed[-1]
    return dict(zip(names, mean.unbind()))
