"""What the bilevel balancers with softmax task weights share (Auto-λ, MOML, FORUM): learned logits α with
their Adam moments as buffers, the validation source, and one process, joint steps and one micro-batch."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from mtl_bench.balancers.validation_source import ValidationSource, require_validation
from mtl_bench.gradient_engine.balancer import Context
from mtl_bench.gradient_engine.staged import StagedBalancer


class SoftmaxLogitsBalancer(StagedBalancer):
    """Task logits α (start at 1/T), weights softmax(α), learned on validation batches from `validation` (the
    engine's validation stream, or a library user's ValidationSource). A subclass names, for its messages, the
    work that must see one batch of every task in one process: `ONE_BATCH_WORK` (e.g. "its look-ahead step"),
    `VALIDATION_WORK` (e.g. "the validation loss") and `STEP_WORK`, what it does once per optimizer step (e.g.
    "one look-ahead step")."""

    ONE_BATCH_WORK = ""
    VALIDATION_WORK = ""
    STEP_WORK = ""
    validation: ValidationSource
    logits: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    opt_step: Tensor

    def __init__(self, task_names: Sequence[str], world_size: int, validation: Optional[ValidationSource]) -> None:
        super().__init__(task_names)
        if world_size != 1:
            raise ValueError(
                f"world_size: {type(self).__name__} runs in one process ({self.ONE_BATCH_WORK} and the update of "
                f"its weights are not synchronized across ranks), got {world_size}"
            )
        # Held as a plain attribute: a source that is itself an nn.Module (a user's wrapper of the model) must not
        # become a submodule, whose parameters would join the balancer's and its state_dict.
        object.__setattr__(self, "validation", require_validation(type(self).__name__, validation))
        n = len(self.task_names)
        self.register_buffer("logits", torch.full((n,), 1.0 / n))
        self.register_buffer("exp_avg", torch.zeros(n))
        self.register_buffer("exp_avg_sq", torch.zeros(n))
        self.register_buffer("opt_step", torch.zeros(()))

    def _stacked(self, losses: dict[str, Tensor]) -> Tensor:
        return torch.stack([losses[name] for name in self.task_names])

    @staticmethod
    def _unscale(grad: Tensor, scale: Optional[Tensor]) -> Tensor:
        return grad / scale if scale is not None else grad

    def per_task_problem(self) -> str:
        return (
            f"{type(self).__name__} has no per-task mode: {self.ONE_BATCH_WORK} and {self.VALIDATION_WORK} need "
            "every task's loss of the same batch; use trainer.step_mode=joint"
        )

    def backward_task(self, task: str, loss: Tensor, shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        raise NotImplementedError(self.per_task_problem())

    def accumulation_problem(self, steps: int) -> Optional[str]:
        if steps == 1:
            return None
        return f"{type(self).__name__} takes {self.STEP_WORK} on one training batch per optimizer step; use 1"
