"""Lin, Jiang, Ye, Zhang, Chen, Chen, Liu & Kwok, arXiv:2308.12029 (2023), "Dual-Balancing for Multi-Task Learning"."""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence

import torch
from torch import Tensor

from mtl_bench import tags
from mtl_bench.balancers.aggregator import Aggregation, Aggregator, StepInfo
from mtl_bench.balancers.checks import at_least, number
from mtl_bench.balancers.weighting import Solution
from mtl_bench.gradient_engine.aggregator_balancer import AggregatorBalancer
from mtl_bench.gradient_engine.balancer import task_list
from mtl_bench.gradient_engine.gradient_balancer import trained
from mtl_bench.gradient_engine.rank_average import rank_mean, world_size
from mtl_bench.gradient_engine.task_grads import pieces_norm

ONE = StepInfo(micro_batches=1, measure=True)  # a call without the engine: one batch, measured


class DualBalancingAggregator(Aggregator):
    """Loss-scale balancing by log losses, gradient-magnitude balancing by rescaling to the largest norm.

    Each step: g_i = ∇_θ log(L_i + eps) at the shared parameters θ (flattened); an EMA per task,
    m_i ← g_i + β_t (m_i − g_i) with β_t = beta / t^beta_sigma (t = 1, 2, ... the optimizer step; m starts
    at 0, not bias-corrected); α_i = max_j ‖m_j‖ / (‖m_i‖ + eps); the shared parameters' gradient is
    Σ_i α_i m_i. The task-specific parameters get the gradient of Σ_i log(L_i + eps) (weight 1 each).

    Reference: LibMTL main `LibMTL/weighting/DB_MTL.py` (commit 4336804847eaa5e0b924b743d76beec7ac3fdc97;
    not in LibMTL 1.1.5), defaults beta = 0.9, beta_sigma = 0 from its config. The gradients are always
    those of the shared parameters: like LibMTL, which has no representation-gradient mode (`rep_grad=True` raises).
    LibMTL takes the T gradients with T backwards through the whole network and then overwrites the shared
    gradients; here the T backwards (one per task through its head and the trunk) give J, and the shared gradients
    receive only Σ_i α_i m_i.

    The log is the aggregator's `objective`: the engine differentiates log(L_i + eps), so autograd scales each
    gradient by 1/(L_i + eps) at the loss node, the heads get their gradients of the log losses, and under
    accumulation and per-task steps every backward takes its own micro-batch's log. g is J unscaled (divided by the
    loss scale and the micro-batches' count, `reads_step`: the step's mean of the backwards' g), float32; Σ_i α_i m_i
    is written scaled as J is, so `scaler.step` unscales it like every other gradient. Under DDP the g_i are averaged
    across ranks before the EMA (one all_reduce of the T×P gradients per step: the EMA must be that of the global
    gradient on every rank), so every rank holds the same EMA and writes the same gradient.

    On one process without accumulation each task's row of the new EMA, d·m_i + (1 − d)·g_i (LibMTL's g + d·(m − g),
    rounded differently), and its norm are made from g_i as its backward returns it (`forward_rows`), while g_i is in
    cache: no (T, P) copy of the gradients is made. A shared parameter the losses do not reach gets a zero row in g
    (LibMTL: zeros too) and still receives its part of Σ_i α_i m_i (LibMTL leaves a parameter without a `.grad`
    alone; the same whenever every shared parameter is used).

    Metrics: `weight/<task>` (α_i), `grad_norm/<task>` (‖g_i‖, only at steps whose measurements are read:
    `measures_gradients`, no Gramian), `db_mtl/ema_norm/<task>` (‖m_i‖). The EMA (T × P floats, built in a staging
    buffer) and the step count are buffers.
    """

    reads_step = True
    measures_gradients = True
    grad_ema: Tensor
    steps: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        shapes: Sequence[torch.Size],
        beta: float = 0.9,
        beta_sigma: float = 0.0,
        eps: float = 1e-8,
    ) -> None:
        """
        task_names: the tasks, in the order of J's rows.
        shapes: the shapes of the shared parameters (J's blocks).
        beta: the EMA's decay at step 1, in [0, 1) (LibMTL: 0.9).
        beta_sigma: the decay falls as beta / t^beta_sigma (>= 0; LibMTL: 0, a constant decay).
        eps: added to each loss before the log and to each norm before dividing (> 0; LibMTL: 1e-8).
        """
        super().__init__()
        self.task_names = list(task_names)
        self.beta, self.beta_sigma = number("beta", beta, 0, 1, below=True), at_least("beta_sigma", beta_sigma, 0)
        self.eps = number("eps", eps, 0, above=True)
        self._shapes = list(shapes)
        self._numels = [s.numel() for s in self._shapes]
        self.register_buffer("grad_ema", torch.zeros(len(self.task_names), sum(self._numels)))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def extra_repr(self) -> str:
        return f"beta={self.beta}, beta_sigma={self.beta_sigma}, eps={self.eps}, shared values={sum(self._numels)}"

    def objective(self, loss: Tensor) -> Tensor:
        return torch.log(loss + self.eps)

    def forward(
        self, blocks: list[Tensor], scale: Optional[Tensor], losses: Tensor, step: StepInfo = ONE
    ) -> Aggregation:
        """J as blocks (the sum of the step's k backwards, this process's): averaged over the ranks, then `_update`."""
        t = blocks[0].shape[0]
        if world_size() > 1:  # one all_reduce of the (T, P) gradients
            flat = rank_mean(torch.cat([b.reshape(t, -1).float() for b in blocks], dim=1))
            rows: Iterable[Sequence[Tensor]] = [row.split(self._numels) for row in flat]
        else:  # each task's pieces, read in place
            rows = ([b[i].float() for b in blocks] for i in range(t))
        return self._update(rows, scale, step)

    def forward_rows(
        self, rows: Iterator[list[Tensor]], scale: Optional[Tensor], losses: Tensor, step: StepInfo = ONE
    ) -> Aggregation:
        return self._update(([g.float() for g in row] for row in rows), scale, step)

    def _update(self, rows: Iterable[Sequence[Tensor]], scale: Optional[Tensor], step: StepInfo) -> Aggregation:
        """Stage the EMA from the committed one and this step's g; Σ α_i m_i (scaled as J) and the metrics.

        g is given task by task: g_i's pieces, one per shared parameter ((n_k,) or p.shape), float32: the sums of
        the step's k gradients of the scaled objectives, times `inv` = 1/(scale·k) (the mean, unscaled) folded into
        the EMA's coefficient, so the unscaling costs no pass of its own; scale·k goes into α likewise."""
        k = step.micro_batches
        steps = self.steps + 1
        decay = (self.beta / steps.double().pow(self.beta_sigma)).float()  # LibMTL: a float64 Python number
        inv = None if scale is None and k == 1 else 1 / (scale * k if scale is not None else torch.tensor(float(k)))
        fresh = 1 - decay if inv is None else (1 - decay) * inv
        ema = self.staging_buffer("grad_ema", self.grad_ema)  # on the CPU it becomes the EMA by a swap
        ema_norms, grad_norms = [], []
        for i, g_i in enumerate(rows):
            for g, old, new in zip(g_i, self.grad_ema[i].split(self._numels), ema[i].split(self._numels)):
                new = new.view(g.shape)  # g may be laid out transposed (a Linear's weight): read in place
                torch.mul(old.view(g.shape), decay, out=new)
                new.addcmul_(g, fresh)
            ema_norms.append(torch.linalg.vector_norm(ema[i]))
            if step.measure:  # the norms of g are only measured
                grad_norms.append(pieces_norm(g_i))
        norms = torch.stack(ema_norms)
        alpha = norms.max() / (norms + self.eps)
        metrics: dict[str, Tensor] = {f"db_mtl/ema_norm/{name}": norms[i] for i, name in enumerate(self.task_names)}
        if grad_norms:
            unscaled = torch.stack(grad_norms) * inv if inv is not None else torch.stack(grad_norms)
            metrics.update({tags.grad_norm(name): unscaled[i] for i, name in enumerate(self.task_names)})
        combined = (alpha / inv if inv is not None else alpha) @ ema  # Σ α_i m_i, scaled as J: no pass of its own
        directions = [d.view(shape) for d, shape in zip(combined.split(self._numels), self._shapes)]
        state = {"grad_ema": ema, "steps": steps}
        # A non-finite element of g makes its row of the new EMA, and its norm, so: the norms stand for g.
        return Aggregation(directions, Solution(alpha, metrics=metrics, state=state), stats=[norms])


class DualBalancing(AggregatorBalancer):
    """DB-MTL (`DualBalancingAggregator`) as a balancer: `balancer=db_mtl`; at the shared parameters.

    The gradients are always those of the shared parameters (no grad_source option), as in LibMTL. Per-task mode
    takes each task's g_i on its own batch and writes the shared gradient at the step's last backward. The state is
    saved under `aggregator.`.
    """

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
        names = task_list(type(self), task_names)
        params = trained(shared_params)
        if not params:
            raise ValueError("shared_params: DB-MTL needs the model's shared parameters, got none that require grad")
        aggregator = DualBalancingAggregator(sorted(names), [p.shape for p in params], beta, beta_sigma, eps)
        super().__init__(task_names, params, aggregator)
