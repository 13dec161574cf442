"""The base of the stochastic methods that need several independent batches per step (MoDo, SDMGrad): the
micro-batches of gradient accumulation serve as the independent draws."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.jacobian import GradientBalancer, gram_metrics, gramian, rank_mean, write_leaf_grads


def project_to_simplex(v: Tensor) -> Tensor:
    """The Euclidean projection onto the probability simplex (the sort-based rule of the references), on the
    device: θ = (Σ_{j≤ρ} u_j − 1)/ρ with u sorted downwards and ρ the last j where u_j > (Σ_{i≤j} u_i − 1)/j."""
    u, _ = torch.sort(v, descending=True)
    css = torch.cumsum(u, dim=0) - 1
    j = torch.arange(1, len(v) + 1, device=v.device, dtype=v.dtype)
    rho = (u > css / j).to(v.dtype).cumsum(0).argmax()  # the last index where the condition holds
    return torch.clamp(v - css[rho] / (rho + 1).to(v.dtype), min=0)


def cross_gramian(left: list[Tensor], right: list[Tensor]) -> Tensor:
    """J_left J_rightᵀ summed over the parameter blocks."""
    total = None
    for a, b in zip(left, right):
        g = a.reshape(a.shape[0], -1).float() @ b.reshape(b.shape[0], -1).float().T
        total = g if total is None else total + g
    assert total is not None
    return total


class MultiBatchBalancer(GradientBalancer):
    """Keeps each micro-batch's Jacobian of a step with gradient accumulation (`trainer.grad_accumulation_steps`
    = k, one of `BATCHES`): the k micro-batches are the method's independent draws. A method implements
    `_combine(jacobians) -> (weights, direction)` on the unscaled, rank-averaged Jacobians (one list of blocks per
    micro-batch, in order); the direction lands in the shared parameters' `.grad` once per step, and the heads
    get the mean of the micro-batches' head gradients (what accumulation gives). Joint steps only.

    Under DDP each micro-batch's Jacobian is averaged over the ranks first (one all-reduce of T times the shared
    parameters per micro-batch), so every rank holds the same state and the draws are those of the global batch.
    """

    SOURCES = ("shared_params",)
    BATCHES: tuple[int, ...] = (3,)

    def _clear_step(self) -> None:
        super()._clear_step()
        self._micro: list[list[Tensor]] = []

    def _add_blocks(self, blocks: list[Tensor]) -> None:
        if self._steps() not in self.BATCHES:
            needed = " or ".join(str(k) for k in self.BATCHES)
            raise RuntimeError(
                f"{type(self).__name__} needs trainer.grad_accumulation_steps={needed} (its independent batches "
                f"per step), got {self._steps()}"
            )
        self._micro.append(blocks)
        self._blocks = blocks if self._blocks is None else [a + b for a, b in zip(self._blocks, blocks)]

    def accumulation_problem(self, steps: int) -> Optional[str]:
        if steps in self.BATCHES:
            return None
        needed = " or ".join(str(k) for k in self.BATCHES)
        return f"{type(self).__name__} needs {needed} micro-batches per step (its independent draws)"

    def per_task_problem(self) -> Optional[str]:
        return (
            f"{type(self).__name__} has no per-task mode: its independent draws are the micro-batches of one "
            "joint step; use trainer.step_mode=joint"
        )

    def _combine(self, jacobians: list[list[Tensor]]) -> tuple[Tensor, list[Tensor]]:
        raise NotImplementedError

    def _finish_solve(
        self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor, shared: Optional[Tensor]
    ) -> dict[str, Tensor]:
        k = len(self._micro)
        jacobians = [[rank_mean(b.float() / scale if scale is not None else b.float()) for b in m] for m in self._micro]
        self._micro = []
        gram = gramian(jacobians[-1])
        self._require_finite(gram, rank_mean(losses))
        weights, direction = self._combine(jacobians)
        # .grad holds the loss scale times the step's gradient: each micro-batch's scale is factor·loss scale.
        factor = scale * k if scale is not None else None
        write_leaf_grads([(p, d.mul_(factor) if factor is not None else d) for p, d in zip(self._params, direction)])
        metrics = {tags.weight(n): v for n, v in zip(self.task_names, weights.unbind())}
        if self.measuring:
            metrics.update(gram_metrics(gram, self.task_names))
        return metrics
