"""Data-parallel training under torchrun: process group, device per rank, DDP wrapping."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_info() -> DistInfo:
    """What torchrun put in the environment (RANK, WORLD_SIZE, LOCAL_RANK); one process otherwise."""
    return DistInfo(
        int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    )


def init_distributed(device: torch.device) -> DistInfo:
    """Join the process group when launched with more than one process: NCCL on CUDA, gloo on CPU."""
    info = launched_info()
    if info.world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return info


def rank_device(device: torch.device, info: DistInfo) -> torch.device:
    """Each rank on its own GPU (cuda:LOCAL_RANK) when training on CUDA with several processes."""
    if device.type == "cuda" and info.world_size > 1:
        return torch.device("cuda", info.local_rank)
    return device


def wrap_ddp(model: nn.Module, device: torch.device, info: DistInfo, per_task: bool) -> nn.Module:
    """DistributedDataParallel around `model` on more than one process; the model itself otherwise.

    In per-task mode each backward reaches only one task's head, so DDP must look for unused parameters.
    """
    if info.world_size == 1:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=per_task)


def shutdown_distributed(info: DistInfo, together: bool = False) -> None:
    """Leave the process group this run joined (a no-op for one process).

    When every rank gets here from the same point (`together`: the run completed, or an agreed stop signal
    stopped it after the same step) the ranks meet at a barrier first: a gloo rank that tears its group down
    while another still uses it can abort in gloo's threads ("terminate called without an active exception").
    A run stopped by an error on one rank does not wait there (the other rank may never arrive).
    """
    if info.world_size > 1 and dist.is_initialized():
        if together:
            dist.barrier()
        dist.destroy_process_group()


def broadcast_text(text: str) -> str:
    """Rank 0's `text` on every rank (e.g. its run directory); unchanged without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return text
    box = [text]
    dist.broadcast_object_list(box, src=0)
    return box[0]
