"""The base of the stochastic methods that need several independent batches per step (MoDo, SDMGrad): the
micro-batches of gradient accumulation serve as the independent draws."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.weighting import Weighting, as_solution, check_solution
from mtl_bench.gradient_engine.balancer import Context, refuse_flat_state
from mtl_bench.gradient_engine.blocks import flat_rows
from mtl_bench.gradient_engine.gradient_balancer import GradientBalancer
from mtl_bench.gradient_engine.gramian import gram_metrics, gramian
from mtl_bench.gradient_engine.graph import task_params
from mtl_bench.gradient_engine.leaf_grads import leaf_grads_root, write_leaf_grads
from mtl_bench.gradient_engine.rank_average import rank_mean
from mtl_bench.gradient_engine.staged import JOINT
from mtl_bench.gradient_engine.task_grads import grads_at_shared, task_jacobian


def project_to_simplex(v: Tensor) -> Tensor:
    """The Euclidean projection onto the probability simplex (the sort-based rule of the references), on the
    device: θ = (Σ_{j≤ρ} u_j − 1)/ρ with u sorted downwards and ρ the last j where u_j > (Σ_{i≤j} u_i − 1)/j."""
    u, _ = torch.sort(v, descending=True)
    css = torch.cumsum(u, dim=0) - 1
    j = torch.arange(1, len(v) + 1, device=v.device, dtype=v.dtype)
    rho = (u > css / j).to(v.dtype).cumsum(0).argmax(0, keepdim=True)  # the last index where the condition holds
    # gather, not css[rho]: indexing by a 0-d tensor reads it on the host (a device sync on a GPU)
    return torch.clamp(v - css.gather(0, rho) / (rho + 1).to(v.dtype), min=0)


def cross_gramian(left: list[Tensor], right: list[Tensor]) -> Tensor:
    """J_left J_rightᵀ summed over the parameter blocks (blocks laid out alike are read in memory order: no copy)."""
    total = None
    for a, b in zip(left, right):
        if a.stride() == b.stride():
            a, b = flat_rows(a), flat_rows(b)
        g = a.reshape(a.shape[0], -1).float() @ b.reshape(b.shape[0], -1).float().T
        total = g if total is None else total + g
    assert total is not None
    return total


class MultiBatchBalancer(GradientBalancer):
    """Takes the k micro-batches of a step with gradient accumulation (`trainer.grad_accumulation_steps` = k, one of
    `batches`) as the method's independent draws. The weights come from the first two draws' Jacobians: a method
    is a `Weighting` whose `forward` gets A = J₁J₂ᵀ (unscaled, rank-averaged) in place of the Gramian. The update
    is d = Jᵀw on the third draw (k = 3), or on the mean of the two (k = 2); the heads get the mean of the
    micro-batches' head gradients (what accumulation gives). Joint steps only. The Jacobians are those of the
    shared parameters (no grad_source option: the methods' references have no shared_rep mode).

    With k = 3 the weights are known before the third micro-batch's backward, so its Jacobian is never taken: each
    task's gradient at `shared` through its head, then one backward of Σ w_i g_i through the trunk, which is w·J₃
    (linearity) at the cost of one backward instead of T. Where a loss reads the shared parameters other than
    through `shared`, J₃ is taken and combined.

    Under DDP each draw's Jacobian is averaged over the ranks first (one all-reduce of T times the shared
    parameters per micro-batch), so every rank holds the same state and weights; the third draw's direction goes
    through DDP's all-reduce like any gradient, which makes it w·mean(J₃).
    """

    weighting: Weighting

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]],
        weighting: Weighting,
        batches: tuple[int, ...],
    ) -> None:
        """
        task_names: the tasks.
        shared_params: the model's shared parameters.
        weighting: the method: weights (and its state's next values) from A = J₁J₂ᵀ in place of the Gramian.
        batches: the numbers of micro-batches the method can take as its draws (3: d from a third draw; 2: from the
            mean of the two).
        """
        super().__init__(task_names, shared_params, "shared_params")
        self.weighting, self.batches = weighting, batches

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        refuse_flat_state(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _clear_step(self) -> None:
        super()._clear_step()
        self._draws: list[list[Tensor]] = []  # the kept draws' Jacobians, of the scaled losses

    def needed_accumulation_steps(self) -> int:
        return max(self.batches)  # every draw the method can take (MoDo's third is the paper's update batch)

    def accumulation_problem(self, steps: int) -> Optional[str]:
        if steps in self.batches:
            return None
        needed = " or ".join(str(k) for k in self.batches)
        return f"{type(self).__name__} needs {needed} micro-batches per step (its independent draws)"

    def per_task_problem(self) -> Optional[str]:
        return (
            f"{type(self).__name__} has no per-task mode: its independent draws are the micro-batches of one "
            "joint step; use trainer.step_mode=joint"
        )

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        self.check_losses(losses)
        scale = self._begin(JOINT, ctx, shared)
        k = self._steps()
        if k not in self.batches:
            needed = " or ".join(str(n) for n in self.batches)
            raise RuntimeError(
                f"{type(self).__name__} needs trainer.grad_accumulation_steps={needed} (its independent batches "
                f"per step), got {k}"
            )
        ordered = [losses[name] for name in self.task_names]
        loss_values = torch.stack([loss.detach().float() for loss in ordered])
        self._losses_sum = loss_values if self._losses_sum is None else self._losses_sum + loss_values
        self._seen["joint"] = self._seen.get("joint", 0) + 1
        found = [task_params(loss, shared, self._param_ids) for loss in ordered]
        if k == 3 and self._seen["joint"] == k and all(cut for _, cut in found):
            metrics = self._third_draw_at_shared(ordered, shared, scale, [own for own, _ in found])
        else:
            spares = self.__dict__.setdefault("_draw_spares", {})  # last step's draws, written over (not state)
            reuse = spares.pop(len(self._draws), None)
            blocks, heads = task_jacobian(ordered, shared, self._params, scale, self._param_ids, reuse)
            write_leaf_grads([pair for task in heads for pair in task])
            self._draws.append([rank_mean(b.float()) for b in blocks])
            if self._seen["joint"] < k:
                return {}
            metrics = self._update_from_draws(scale)
        self._end_joint()
        return metrics

    def _unscaled_weights(self, scale: Optional[Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """The weights from the first two draws; the finiteness check and the measurements (of the second draw).
        The draws hold the gradients of the scaled losses: A and G are divided by the scale squared."""
        first, second = self._draws[0], self._draws[1]
        assert self._losses_sum is not None  # set by every backward of the step
        cross = cross_gramian(first, second)
        cross = cross / (scale * scale) if scale is not None else cross
        losses = rank_mean(self._losses_sum) / self._seen["joint"]
        self._require_finite(cross, losses)
        solution = as_solution(self.weighting(cross, losses))
        check_solution(solution, len(self.task_names), None, cross, self.part_name)
        self._stage(**{f"weighting.{name}": value for name, value in solution.state.items()})
        weights = solution.weights
        metrics = {tags.weight(n): v for n, v in zip(self.task_names, weights.unbind())} | solution.metrics
        if self.measuring:
            gram = gramian(second)
            metrics.update(gram_metrics(gram / (scale * scale) if scale is not None else gram, self.task_names))
        return weights, metrics

    def _keep_draws(self) -> None:
        """This step's draws become the next step's buffers (a fresh T x P buffer costs its page faults)."""
        self.__dict__["_draw_spares"] = dict(enumerate(self._draws))
        self._draws = []

    def _third_draw_at_shared(
        self, losses: list[Tensor], shared: Tensor, scale: Optional[Tensor], own: list[list[Tensor]]
    ) -> dict[str, Tensor]:
        """d = w·J₃ as one backward of Σ w_i g_i (g_i: task i's gradient at `shared`) through the trunk; the heads'
        gradients in the same autograd call. `.grad` holds the loss scale times d: each micro-batch's scale is
        factor·loss scale, and the factor is 1/k."""
        weights, metrics = self._unscaled_weights(scale)
        self._keep_draws()
        rows, heads = grads_at_shared(losses, shared, scale, self._param_ids, own)
        direction = (weights.to(rows.dtype) @ rows.flatten(1)).view_as(shared) * self._steps()
        pairs = [pair for task in heads for pair in task]
        roots = [shared, leaf_grads_root(pairs)] if pairs else [shared]
        torch.autograd.backward(roots, [direction, *[None] * (len(roots) - 1)])
        return metrics

    def _update_from_draws(self, scale: Optional[Tensor]) -> dict[str, Tensor]:
        """d = w·J₃ (k = 3, a loss that reads the trunk other than through `shared`) or w·(J₁ + J₂)/2 (k = 2), from
        the kept Jacobians of the scaled losses, times k: the loss scale times d."""
        weights, metrics = self._unscaled_weights(scale)
        update = self._draws[2] if len(self._draws) == 3 else [(a + b) / 2 for a, b in zip(*self._draws)]
        self._keep_draws()
        t, k = len(self.task_names), self._steps()
        directions = [(p, (weights @ j.reshape(t, -1)).view(j.shape[1:]).mul_(k)) for p, j in zip(self._params, update)]
        write_leaf_grads(directions)
        return metrics
