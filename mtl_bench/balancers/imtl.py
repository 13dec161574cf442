"""Liu et al., ICLR 2021, "Towards Impartial Multi-task Learning" (IMTL-G, IMTL-L, IMTL-H)."""

from __future__ import annotations

from functools import partial
from typing import Iterable, Literal, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from mtl_bench.balancers.adam_update import adam_update
from mtl_bench.balancers.checks import number, one_of
from mtl_bench.balancers.weighting import Solution, Weighting
from mtl_bench.gradient_engine.gramian_balancer import GramianBalancer
from mtl_bench.gradient_engine.host import host_gramian, nan_weights, to_device

MODES = ("hybrid", "gradient", "loss")
OPTIMIZERS = ("adam", "sgd")


def imtl_g_weights(gram: np.ndarray) -> np.ndarray:
    """α with Σα = 1 whose combination g = Σ α_i g_i has the same projection on every unit gradient u_i:
    (Gα)_i / ‖g_i‖ = const, so α ∝ G⁺ n with n_i = ‖g_i‖ (the pseudo-inverse also covers linearly dependent
    gradients, as torchjd's IMTLG does; 0 when the sum vanishes)."""
    norms = np.sqrt(np.clip(np.diag(gram), 0, None))
    v = np.linalg.pinv(gram) @ norms
    total = v.sum()
    return np.zeros_like(v) if abs(total) < 1e-12 else v / total


class IMTLWeighting(Weighting):
    """Impartial MTL: IMTL-G weights the gradients so that the shared direction has equal projections on
    every task's unit gradient (`imtl_g_weights`); IMTL-L scales each loss by a learned e^{s_i} (training
    e^{s_i} L_i − s_i, so s_i moves towards −log L_i); IMTL-H (`mode="hybrid"`, the paper's method) does both:
    IMTL-G on the gradients of the scaled losses.

    The shared parameters get Σ_i α_i e^{s_i} g_i (hybrid), Σ_i e^{s_i} g_i (loss) or Σ_i α_i g_i (gradient);
    the heads get e^{s_i} ∇L_i (hybrid, loss) or ∇L_i (gradient). s takes one step of its own optimizer
    (`scale_optimizer`, `scale_lr`) on ∂/∂s_i = e^{s_i} L_i − 1 per optimizer step (LibMTL trains s with the
    model's optimizer: give the same optimizer and learning rate to match it). s is a buffer (checkpointed);
    a skipped step leaves it unchanged.

    References: LibMTL 1.1.5 `IMTL` (IMTL-H; its closed form with a matrix inverse equals the pseudo-inverse
    form for linearly independent gradients) and torchjd 0.18 `IMTLG` (IMTL-G). `grad_source=shared_rep`
    as LibMTL's rep_grad=True, but on the batch-flattened representation gradients (LibMTL sums them over
    the batch first).

    Metrics: `weight/<task>` (the weight of the raw g_i), `grad_norm/<task>`, `grad_cos/<a>/<b>`,
    `imtl/loss_scale/<task>` (s_i used this step).
    """

    HOST_SOLVE = "a T×T pseudo-inverse (numpy)"

    loss_scale: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    opt_step: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        mode: str = "hybrid",
        scale_optimizer: str = "adam",
        scale_lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        """
        task_names: the tasks, sorted (given by the engine).
        mode: hybrid (IMTL-H), gradient (IMTL-G) or loss (IMTL-L).
        scale_optimizer: the optimizer of the loss scales s: adam or sgd (unused in gradient mode).
        scale_lr: its learning rate (> 0).
        betas: Adam's betas for s.
        eps: Adam's eps for s.
        """
        super().__init__()
        one_of("mode", mode, MODES)
        one_of("scale_optimizer", scale_optimizer, OPTIMIZERS)
        number("scale_lr", scale_lr, 0, above=True)
        self.mode, self.scale_optimizer, self.scale_lr = mode, scale_optimizer, float(scale_lr)
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)
        self.task_names = list(task_names)
        self.weighs_heads = mode != "gradient"  # the heads get e^{s_i} ∇L_i
        n = len(self.task_names)
        self.register_buffer("loss_scale", torch.zeros(n))
        self.register_buffer("exp_avg", torch.zeros(n))
        self.register_buffer("exp_avg_sq", torch.zeros(n))
        self.register_buffer("opt_step", torch.zeros(()))

    def extra_repr(self) -> str:
        return f"mode={self.mode}"

    def forward(self, gram: Tensor, losses: Tensor) -> Solution:
        t = len(self.task_names)
        s = self.loss_scale.clone()
        metrics = {f"imtl/loss_scale/{name}": v for name, v in zip(self.task_names, s.unbind())}
        scales = s.exp() if self.mode != "gradient" else torch.ones_like(s)
        state = self._updated_scales(losses) if self.mode != "gradient" else {}
        if self.mode == "loss":
            return Solution(scales.to(gram.device), scales.to(gram.device), metrics, state)
        g = host_gramian(gram * (scales[:, None] * scales[None, :]).to(gram.device))
        alpha = nan_weights(t, gram) if g is None else to_device(imtl_g_weights(g), gram)
        head = None if self.mode == "gradient" else scales.to(gram.device)
        return Solution(alpha * scales.to(gram.device), head, metrics, state)

    def _updated_scales(self, losses: Tensor) -> dict[str, Tensor]:
        """s − step(e^s L − 1) from the committed s, and the optimizer's new state."""
        grad = self.loss_scale.exp() * losses.to(self.loss_scale.device) - 1
        if self.scale_optimizer == "adam":
            new, exp_avg, exp_avg_sq, step = adam_update(
                self.loss_scale, grad, self.exp_avg, self.exp_avg_sq, self.opt_step, self.scale_lr, self.betas, self.eps
            )
            return {"loss_scale": new, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "opt_step": step}
        return {"loss_scale": self.loss_scale - self.scale_lr * grad}


class IMTL(GramianBalancer):
    """IMTL (`IMTLWeighting`) as a balancer: `balancer=imtl`."""

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        grad_source: Literal["shared_params", "shared_rep"] = "shared_params",
        mode: str = "hybrid",
        scale_optimizer: str = "adam",
        scale_lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        grad_source: shared_params (exact) or shared_rep (gradients at the shared representation).
        mode: hybrid (IMTL-H), gradient (IMTL-G) or loss (IMTL-L).
        scale_optimizer: the optimizer of the loss scales s: adam or sgd (unused in gradient mode).
        scale_lr: its learning rate (> 0).
        betas: Adam's betas for s.
        eps: Adam's eps for s.
        """
        weighting = partial(
            IMTLWeighting, mode=mode, scale_optimizer=scale_optimizer, scale_lr=scale_lr, betas=betas, eps=eps
        )
        super().__init__(task_names, shared_params, weighting, grad_source)
