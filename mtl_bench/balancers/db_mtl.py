"""Lin, Jiang, Ye, Zhang, Chen, Chen, Liu & Kwok, arXiv:2308.12029 (2023), "Dual-Balancing for Multi-Task Learning"."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.checks import at_least, number
from mtl_bench.gradient_engine.balancer import Context
from mtl_bench.gradient_engine.graph import head_params
from mtl_bench.gradient_engine.leaf_grads import write_leaf_grads
from mtl_bench.gradient_engine.rank_average import rank_mean, world_size
from mtl_bench.gradient_engine.staged import JOINT, PER_TASK, StagedBalancer, scaled_grad
from mtl_bench.gradient_engine.task_grads import float_task_rows, pieces_norm, task_jacobian


class DualBalancing(StagedBalancer):
    """Loss-scale balancing by log losses, gradient-magnitude balancing by rescaling to the largest norm.

    Each step: g_i = ∇_θ log(L_i + eps) at the shared parameters θ (flattened); an EMA per task,
    m_i ← g_i + β_t (m_i − g_i) with β_t = beta / t^beta_sigma (t = 1, 2, ... the optimizer step; m starts
    at 0, not bias-corrected); α_i = max_j ‖m_j‖ / (‖m_i‖ + eps); the shared parameters' gradient is
    Σ_i α_i m_i. The task-specific parameters get the gradient of Σ_i log(L_i + eps) (weight 1 each).

    Reference: LibMTL main `LibMTL/weighting/DB_MTL.py` (commit 4336804847eaa5e0b924b743d76beec7ac3fdc97;
    not in LibMTL 1.1.5), defaults beta = 0.9, beta_sigma = 0 from its config. The gradients are always
    those of the shared parameters (no grad_source option): like LibMTL, which has no representation-gradient mode
    (`rep_grad=True` raises). LibMTL takes the T gradients with T
    backwards through the whole network and then overwrites the shared gradients; here the T backwards
    (`task_grads.float_task_rows`, one per task through its head and the trunk) each make row i of the new EMA from
    g_i as it arrives (on one process without accumulation; otherwise from the (T, P) gradients, see below), and
    the shared gradients receive only Σ_i α_i m_i. A shared parameter the losses do not reach gets a zero
    row in g (LibMTL: zeros too) and still receives its part of Σ_i α_i m_i (LibMTL leaves a parameter
    without a `.grad` alone; the same whenever every shared parameter is used).

    The g_i are the unscaled gradients (divided by the grad scaler's scale), float32; Σ_i α_i m_i is
    multiplied by the scale again when written, so `scaler.step` unscales it like every other gradient.
    Under accumulation (k micro-batches) the g_i are averaged over the step's micro-batches and the shared
    gradient is written once, at the k-th backward, from the whole step's mean. Per-task mode takes each
    task's g_i on its own batch and writes the shared gradient at the step's last backward (every task k
    times). Under DDP the g_i are averaged across ranks before the EMA (one all_reduce of the T×P
    gradients per backward: the EMA must be that of the global gradient on every rank), so every rank holds
    the same EMA and writes the same gradient.

    Metrics: `weight/<task>` (α_i), `grad_norm/<task>` (‖g_i‖, only at steps whose measurements are read,
    `BackwardContext.measure`), `db_mtl/ema_norm/<task>` (‖m_i‖), from the backward that
    writes the shared gradient. The EMA (T × P floats) and the step count are buffers.
    """

    grad_ema: Tensor
    steps: Tensor
    _params: list[Tensor]
    grad_source = "shared_params"  # its only one (scripts/methods_table.py reads it)

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        beta: float = 0.9,
        beta_sigma: float = 0.0,
        eps: float = 1e-8,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters θ (given by the engine).
        beta: the EMA's decay at step 1, in [0, 1) (LibMTL: 0.9).
        beta_sigma: the decay falls as beta / t^beta_sigma (>= 0; LibMTL: 0, a constant decay).
        eps: added to each loss before the log and to each norm before dividing (> 0; LibMTL: 1e-8).
        """
        super().__init__(task_names)
        self.beta, self.beta_sigma = number("beta", beta, 0, 1, below=True), at_least("beta_sigma", beta_sigma, 0)
        self.eps = number("eps", eps, 0, above=True)
        params = [p for p in shared_params or [] if p.requires_grad]
        if not params:
            raise ValueError("shared_params: DB-MTL needs the model's shared parameters, got none that require grad")
        self.__dict__["_params"] = params  # the model's: kept out of this module's registry and state_dict
        self._param_ids = {id(p) for p in params}
        self._numels = [p.numel() for p in params]
        self.register_buffer("grad_ema", torch.zeros(len(self.task_names), sum(self._numels)))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def _reset(self) -> None:
        super()._reset()
        self._backwards = 0  # backwards in this step (joint: micro-batches; per-task: all tasks' together)

    def extra_repr(self) -> str:
        return (
            f"tasks={self.task_names}, beta={self.beta}, beta_sigma={self.beta_sigma}, "
            f"shared_params={len(self._numels)} tensors ({sum(self._numels)} values)"
        )

    # ------------------------------------------------------------------ the update

    def _steps_per_update(self) -> int:
        return self._ctx.accumulation_steps if self._ctx is not None else 1

    def _update(self, rows: Iterable[Sequence[Tensor]], inv: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        """Stage the EMA from the committed one and this step's g; return Σ α_i m_i (P,) and the metrics.

        g is given task by task: g_i's pieces, one per shared parameter ((n_k,) or p.shape), float32, times `inv`
        (None: 1): the gradients of the scaled losses and 1/scale, so the unscaling costs no pass of its own. In
        the common case they are what task i's backward returns (`float_task_rows`): row i of the new EMA,
        d·m_i + (1 − d)·g_i (LibMTL's g + d·(m − g), rounded differently), and its norm are made while g_i is in
        cache, and no (T, P) copy of the gradients is made.
        """
        steps = self.steps + 1
        decay = (self.beta / steps.double().pow(self.beta_sigma)).float()  # LibMTL: a float64 Python number
        fresh = 1 - decay if inv is None else (1 - decay) * inv
        ema = self._staging_buffer("grad_ema", self.grad_ema)  # on the CPU it becomes the EMA by a swap
        ema_norms, grad_norms = [], []
        for i, g_i in enumerate(rows):
            for g, old, new in zip(g_i, self.grad_ema[i].split(self._numels), ema[i].split(self._numels)):
                new = new.view(g.shape)  # g may be laid out transposed (a Linear's weight): read in place
                torch.mul(old.view(g.shape), decay, out=new)
                new.addcmul_(g, fresh)
            ema_norms.append(torch.linalg.vector_norm(ema[i]))
            if self.measuring:  # the norms of g are only measured
                grad_norms.append(pieces_norm(g_i))
        norms = torch.stack(ema_norms)
        self._require_finite(norms)  # a non-finite element of g makes its row of the new EMA, and its norm, so
        alpha = norms.max() / (norms + self.eps)
        self._stage(grad_ema=ema, steps=steps)
        metrics: dict[str, Tensor] = {}
        for i, name in enumerate(self.task_names):
            metrics[tags.weight(name)] = alpha[i]
            metrics[f"db_mtl/ema_norm/{name}"] = norms[i]
        if grad_norms:
            unscaled = torch.stack(grad_norms) * inv if inv is not None else torch.stack(grad_norms)
            metrics.update({tags.grad_norm(name): unscaled[i] for i, name in enumerate(self.task_names)})
        return alpha @ ema, metrics

    def _write(
        self, rows: Iterable[Sequence[Tensor]], inv: Tensor | None, heads: list[tuple[Tensor, Tensor]]
    ) -> dict[str, Tensor]:
        """The step's update from g (`_update`); Σ α_i m_i (times the loss scale) lands in the shared parameters'
        `.grad`, with the heads' gradients (filled while the rows are read) in the same autograd call."""
        combined, metrics = self._update(rows, inv)
        if self._loss_scale is not None:
            combined = combined * self._loss_scale
        pieces = combined.split(self._numels)
        write_leaf_grads([*((p, piece.view_as(p)) for p, piece in zip(self._params, pieces)), *heads])
        return metrics

    def _rows(self, flat: Tensor) -> list[list[Tensor]]:
        """The (T, P) gradients as each task's pieces (`_update`)."""
        return [list(row.split(self._numels)) for row in flat]

    def _check_open(self, expected: int) -> None:
        if self._backwards >= expected:
            self._reset()
            raise RuntimeError(
                "DualBalancing: the previous step's update is still pending; call balancer.step() after "
                "each optimizer step (after scaler.update() when there is a grad scaler)"
            )

    def _flat(self, blocks: Sequence[Tensor], scale: Tensor | None) -> Tensor:
        """Per-task gradient blocks (T, *p.shape) as T rows (T, P), float32, unscaled, averaged over the ranks."""
        flat = torch.cat([b.reshape(b.shape[0], -1).float() for b in blocks], dim=1)
        return rank_mean(flat / scale if scale is not None else flat)

    def _log(self, loss: Tensor) -> Tensor:
        return torch.log(loss + self.eps)

    # ------------------------------------------------------------------ joint and per-task modes

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        self.check_losses(losses)
        scale = self._begin(JOINT, ctx, shared)
        self._check_open(self._steps_per_update())
        logs = [self._log(losses[name]) for name in self.task_names]
        self._backwards += 1
        if world_size() == 1 and not self.accumulates:  # the common case: no (T, P) copy, unscaled in the EMA
            inv = 1 / scale if scale is not None else None
            heads: list[tuple[Tensor, Tensor]] = []
            rows = float_task_rows(logs, shared, self._params, scale, self._param_ids, heads)
            metrics = self._write(rows, inv, heads)
        else:
            blocks, task_heads = task_jacobian(logs, shared, self._params, scale, self._param_ids)
            write_leaf_grads([pair for own in task_heads for pair in own])
            grads = self._mean("grads", self._flat(blocks, scale))
            del blocks
            if self._backwards < self._steps_per_update():
                return {}
            metrics = self._write(self._rows(grads), None, [])
        self._end_joint()
        return metrics

    def backward_task(self, task: str, loss: Tensor, shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        """Per-task mode: the task's g_i on its own batch; the shared gradient is written at the step's last
        backward."""
        scale = self._begin(PER_TASK, ctx, shared)
        if task not in self._index:
            raise KeyError(f"task {task!r} is not one of the balancer's tasks {self.task_names}")
        self._check_open(len(self.task_names) * self._steps_per_update())
        log = self._log(loss)
        heads = head_params(log, shared, self._param_ids)
        grads = scaled_grad(log, [*self._params, *heads], scale, allow_unused=True)
        blocks = [(g if g is not None else torch.zeros_like(p)).unsqueeze(0) for g, p in zip(grads, self._params)]
        self._collect(task, grad=self._flat(blocks, scale)[0])
        write_leaf_grads([(p, g) for p, g in zip(heads, grads[len(self._params) :]) if g is not None])
        self._backwards += 1
        if self._backwards < len(self.task_names) * self._steps_per_update():
            return {}
        stacked = torch.stack([self._collected[name]["grad"] for name in self.task_names])
        return self._write(self._rows(stacked), None, [])

    def step(self, skipped: bool | Tensor | None = None) -> dict[str, Tensor]:
        expected = (1 if self._mode == JOINT else len(self.task_names)) * self._steps_per_update()
        if self._mode is not None and self._backwards != expected:
            done = self._backwards
            self._reset()
            raise RuntimeError(
                f"DualBalancing: step() after {done} of {expected} backwards; the shared gradient "
                "was never written and the update was dropped"
            )
        return super().step(skipped)
