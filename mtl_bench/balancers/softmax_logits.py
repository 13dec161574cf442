"""What the bilevel methods with softmax task weights share (Auto-λ, MOML, FORUM), as functions each calls: learned
logits α with their Adam moments as buffers of its weighting, which holds the validation source, and its balancer's
refusals of several processes, per-task steps and several micro-batches."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.loss_weighting import LossWeighting
from mtl_bench.balancers.validation_source import ValidationSource, require_validation
from mtl_bench.gradient_engine.balancer import Balancer


def bilevel_source(
    name: str, world_size: int, validation: Optional[ValidationSource], one_batch_work: str
) -> ValidationSource:
    """A bilevel balancer's build-time checks, in this order: one process (`one_batch_work`, e.g. "its look-ahead
    step", names what is not synchronized), then its validation source, returned. `name`: the balancer's class."""
    if world_size != 1:
        raise ValueError(
            f"world_size: {name} runs in one process ({one_batch_work} and the update of its weights are not "
            f"synchronized across ranks), got {world_size}"
        )
    return require_validation(name, validation)


def hold_softmax_logits(weighting: LossWeighting, tasks: int, validation: ValidationSource) -> None:
    """Keep the validation source on the weighting and register the logits α of its `tasks` tasks (start at 1/T) and
    their Adam moments as its buffers."""
    # Held as a plain attribute: a source that is itself an nn.Module (a user's wrapper of the model) must not
    # become a submodule, whose parameters would join the balancer's and its state_dict.
    object.__setattr__(weighting, "validation", validation)
    weighting.register_buffer("logits", torch.full((tasks,), 1.0 / tasks))
    weighting.register_buffer("exp_avg", torch.zeros(tasks))
    weighting.register_buffer("exp_avg_sq", torch.zeros(tasks))
    weighting.register_buffer("opt_step", torch.zeros(()))


def stacked(task_names: Sequence[str], losses: dict[str, Tensor]) -> Tensor:
    return torch.stack([losses[name] for name in task_names])


def unscale(grad: Tensor, scale: Optional[Tensor]) -> Tensor:
    return grad / scale if scale is not None else grad


def no_per_task_mode(balancer: Balancer, one_batch_work: str, validation_work: str) -> str:
    return (
        f"{type(balancer).__name__} has no per-task mode: {one_batch_work} and {validation_work} need every task's "
        "loss of the same batch; use trainer.step_mode=joint"
    )


def one_micro_batch(balancer: Balancer, steps: int, step_work: str) -> Optional[str]:
    """Why `steps` micro-batches cannot run (`step_work`: what the method does once per optimizer step), or None."""
    if steps == 1:
        return None
    return f"{type(balancer).__name__} takes {step_work} on one training batch per optimizer step; use 1"
