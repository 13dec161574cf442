"""Zhou et al., NeurIPS 2022, "On the Convergence of Stochastic Multi-Objective Gradient Manipulation and Beyond"
(CR-MOGM)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

import torch
from torch import Tensor

import mtl_bench.balancers as balancers
from mtl_bench.balancers.gradient_balancer import GradientBalancer
from mtl_bench.balancers.weighting import Solution


def stateless_base(name: str) -> type[GradientBalancer]:
    """The gradient method `name` (a class of mtl_bench.balancers) if CR-MOGM can wrap it: one weight per task
    from the Gramian alone, with no state of its own (its updates would never be committed here)."""
    cls = getattr(balancers, name, None)
    if not (isinstance(cls, type) and issubclass(cls, GradientBalancer)) or cls is CRMOGM:
        options = sorted(n for n in balancers.__all__ if _is_gradient_method(getattr(balancers, n)))
        raise ValueError(f"base: {name!r} is not a gradient method of mtl_bench.balancers ({', '.join(options)})")
    if cls._finish_solve is not GradientBalancer._finish_solve or cls.HEADS_FROM_SOLUTION:
        raise ValueError(f"base: {name} does not weight whole task gradients with unit head weights")
    return cls


def _is_gradient_method(cls: object) -> bool:
    return isinstance(cls, type) and issubclass(cls, GradientBalancer) and cls is not CRMOGM


class CRMOGM(GradientBalancer):
    """Correlation-reduced MOGM: the weights λ̂_k that a gradient method (`base`) computes at step k are
    smoothed by an exponential moving average, λ_k = α λ_{k−1} + (1 − α) λ̂_k with λ_0 = λ̂_1, and d = Σ_i λ_k,i g_i.
    The smoothing reduces the correlation between the weights and the mini-batch's noise, which is what the
    paper's convergence proof needs.

    Reference: torchjd 0.18 `CRMOGMWeighting` wrapped around a Gramian weighting (e.g. `UPGradWeighting`). The
    base is built with the same tasks, shared parameters and grad_source plus `base_options`; it must be a
    stateless method weighting whole gradients (MGDA, UPGrad, DualProj, ConFIG, Krum, ...; a base with state of
    its own or per-block weights is refused). λ and whether it has started are buffers. The heads get their
    own gradients (weight 1), as torchjd's mtl_backward gives them.

    Metrics: the base's metrics, with `weight/<task>` the smoothed λ and `cr_mogm/raw/<task>` the base's λ̂.
    """

    HOST_SOLVE = "the wrapped method's host solve (UPGrad's QPs by default)"

    lambdas: Tensor
    started: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        grad_source: str = "shared_params",
        base: str = "UPGrad",
        base_options: Optional[Mapping[str, Any]] = None,
        alpha: float = 0.9,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        grad_source: shared_params or shared_rep, as the base allows.
        base: the wrapped gradient method, a class name of mtl_bench.balancers (UPGrad, MGDA, DualProj, ...).
        base_options: the base's own options ({name: value}); null: its defaults.
        alpha: the EMA's weight α in [0, 1] on the previous λ (0: the base unchanged).
        """
        cls = stateless_base(base)
        self.SOURCES = cls.SOURCES
        super().__init__(task_names, shared_params, grad_source)
        params = list(shared_params or [])
        try:
            self._base = cls(list(task_names), params, grad_source, **dict(base_options or {}))
        except TypeError as error:
            raise ValueError(f"base_options: {error}") from None
        except ValueError as error:
            raise ValueError(f"base_options.{error}") from None
        if self._base.state_dict():  # buffers or a generator: updates this wrapper would never commit
            raise ValueError(f"base: {base} has state of its own ({', '.join(self._base.state_dict())})")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
            raise ValueError(f"alpha: must be a number in [0, 1], got {alpha!r}")
        self.base, self.alpha = base, float(alpha)
        self.register_buffer("lambdas", torch.zeros(len(self.task_names)))
        self.register_buffer("started", torch.tensor(False))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, base={self.base}, alpha={self.alpha}"

    def _solve(self, gram: Tensor, losses: Tensor) -> Solution:
        raw = self._base._solve(gram, losses)
        if raw.weights.dim() != 1:
            raise ValueError(f"base: {self.base} gives one weight row per parameter block; CR-MOGM needs one per task")
        previous = torch.where(self.started, self.lambdas, raw.weights)
        smoothed = self.alpha * previous + (1 - self.alpha) * raw.weights
        self._stage(lambdas=smoothed, started=torch.ones_like(self.started))
        metrics = dict(raw.metrics)
        metrics.update({f"cr_mogm/raw/{name}": v for name, v in zip(self.task_names, raw.weights.unbind())})
        return Solution(smoothed, metrics=metrics)
