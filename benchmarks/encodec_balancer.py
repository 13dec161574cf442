"""EnCodec's loss balancer (Défossez et al. 2022), as in github.com/facebookresearch/encodec `encodec/balancer.py`.

Reimplemented for the benchmarks only (a peer to time `RescaledNormBalancer` against), step for step as
the public code does it: per loss `autograd.grad(loss, [input], retain_graph=True)`, the norm per batch item
then averaged, an EMA of the norms kept in Python floats (`float(value)`: one host read per loss per step),
the rescaled gradients summed into `out_grad`, and ONE `input.backward(out_grad)`. Like the original, the
heads between `input` and the losses get no gradient (the defect `RescaledNormBalancer` fixes), and on one
process `distrib.average_metrics` returns its argument, so it is left out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch
from torch import Tensor, autograd


def averager(beta: float = 1.0) -> Callable[..., dict[str, float]]:
    """The EMA callback of the original: bias-corrected, `beta=1` a plain mean."""
    fix: dict[str, float] = defaultdict(float)
    total: dict[str, float] = defaultdict(float)

    def update(metrics: dict[str, Tensor | float], weight: float = 1.0) -> dict[str, float]:
        for key, value in metrics.items():
            total[key] = total[key] * beta + weight * float(value)
            fix[key] = fix[key] * beta + weight
        return {key: tot / fix[key] for key, tot in total.items()}

    return update


class EncodecBalancer:
    """`Balancer(weights, rescale_grads, total_norm, ema_decay, per_batch_item, epsilon, monitor)` of EnCodec."""

    def __init__(
        self,
        weights: dict[str, float],
        rescale_grads: bool = True,
        total_norm: float = 1.0,
        ema_decay: float = 0.999,
        per_batch_item: bool = True,
        epsilon: float = 1e-12,
        monitor: bool = False,
    ) -> None:
        self.weights = weights
        self.per_batch_item = per_batch_item
        self.total_norm = total_norm
        self.averager = averager(ema_decay)
        self.epsilon = epsilon
        self.monitor = monitor
        self.rescale_grads = rescale_grads
        self.metrics: dict[str, float] = {}
        self.factors: dict[str, float] = {}

    def backward(self, losses: dict[str, Tensor], input: Tensor) -> None:
        norms = {}
        grads = {}
        for name, loss in losses.items():
            (grad,) = autograd.grad(loss, [input], retain_graph=True)
            if self.per_batch_item:
                dims = tuple(range(1, grad.dim()))
                norm = grad.norm(dim=dims).mean()
            else:
                norm = grad.norm()
            norms[name] = norm
            grads[name] = grad
        avg_norms = self.averager(norms)  # distrib.average_metrics(..., count): the identity on one process
        total = sum(avg_norms.values())
        self.metrics = {}
        if self.monitor:
            for k, v in avg_norms.items():
                self.metrics[f"ratio_{k}"] = v / total
        total_weights = sum([self.weights[k] for k in avg_norms])
        ratios = {k: w / total_weights for k, w in self.weights.items()}
        out_grad: Any = 0
        self.factors = {}  # not in the original: what each loss's gradient was multiplied by (`encodec_step`)
        for name, avg_norm in avg_norms.items():
            if self.rescale_grads:
                scale = ratios[name] * self.total_norm / (self.epsilon + avg_norm)
                grad = grads[name] * scale
            else:
                grad = self.weights[name] * grads[name]
            self.factors[name] = scale if self.rescale_grads else self.weights[name]
            out_grad += grad
        input.backward(out_grad)


def encodec_step(names: list[str], train_heads: bool = False) -> Callable:
    """A bench peer: forward, per-task MSE, EnCodec's backward at the shared representation (weights 1).

    `train_heads`: then also each head's gradient of its loss times the factor EnCodec gave that loss, by one
    backward of Σ factor_k L_k restricted to the heads' parameters (`inputs=`, so it stops at the shared
    representation): the least a user of EnCodec's Balancer adds for heads with parameters, and the same
    gradients as `RescaledNormBalancer` gives them (tests/benchmarks/test_encodec_balancer.py)."""
    import torch.nn.functional as F

    balancer = EncodecBalancer({n: 1.0 for n in names})

    def backward(model: torch.nn.Module, x: Tensor, targets: dict[str, Tensor]) -> None:
        out = model(x)
        losses = {n: F.mse_loss(out.preds[n], y) for n, y in targets.items()}
        balancer.backward(losses, out.shared)
        if train_heads:
            heads = [p for n in names for p in model.get_submodule(f"heads.{n}").parameters()]
            total = torch.stack([balancer.factors[n] * losses[n] for n in names]).sum()
            torch.autograd.backward(total, inputs=heads)

    return backward
