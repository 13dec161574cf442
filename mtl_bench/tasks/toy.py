"""GradNorm's synthetic multi-task regression (Chen et al., "GradNorm", ICML 2018, section 4).

Task i is f_i(x) = sigma_i * tanh((B + eps_i) x), x in R^in_dim, f_i(x) in R^out_dim. B (out_dim x in_dim)
is shared by every task; eps_i is task i's own perturbation. The paper writes the entries as iid
N(0, 10) and N(0, 3.5). We read the second argument as the *variance* (the usual N(mu, sigma^2)
notation), hence `b_var` / `eps_var`: std sqrt(10) ~ 3.16 and sqrt(3.5) ~ 1.87. Some public
reimplementations pass 10 and 3.5 as the std to `np.random.normal`; that gives larger matrices, but
with the input scale below the only effect is the relative size of eps_i to B (task relatedness).

The paper does not state how x is distributed. We draw x entries iid N(0, input_std^2) with default
input_std = 1 / sqrt(in_dim * (b_var + eps_var)): each pre-activation ((B + eps_i) x)_k then has
variance in_dim * (b_var + eps_var) * input_std^2 = 1, so tanh works in its non-saturated range and
the tasks differ mainly by their scale sigma_i (the point of the experiment). The model is fed the
standardised x / input_std (unit-variance features); the targets are computed from x itself.

Train/val/test are independent draws of x with the same B and eps_i; everything comes from one
generator seeded by `data_seed`, so the data are identical across runs.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import torch
from torch import Generator, Tensor

from mtl_bench.tasks.base import Split, Task, TaskSet
from mtl_bench.tasks.losses import mse_loss, mse_metrics


def toy_params(
    n_tasks: int,
    in_dim: int = 250,
    out_dim: int = 100,
    b_var: float = 10.0,
    eps_var: float = 3.5,
    data_seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """(B, eps): B (out_dim, in_dim) and eps (n_tasks, out_dim, in_dim), exactly as `ToyRegression` draws them."""
    return _draw_params(_generator(data_seed), n_tasks, in_dim, out_dim, b_var, eps_var)


class ToyRegression(TaskSet):
    """Tasks "t0".."t{T-1}", T = len(sigmas); loss MSE, metric "mse" (lower is better)."""

    def __init__(
        self,
        sigmas: Sequence[float],
        n_train: int = 10000,
        n_val: int = 1000,
        n_test: int = 1000,
        in_dim: int = 250,
        out_dim: int = 100,
        b_var: float = 10.0,
        eps_var: float = 3.5,
        input_std: Optional[float] = None,
        noise_std: float = 0.0,
        data_seed: int = 0,
        reference: Optional[Mapping[str, Mapping[str, float]]] = None,
    ) -> None:
        """
        sigmas: each task's scale sigma_i (one task per entry).
        n_train: training samples (> 0).
        n_val: validation samples (> 0).
        n_test: test samples (> 0).
        in_dim: input width (> 0).
        out_dim: each task's output width (> 0).
        b_var: variance of the shared matrix B's entries.
        eps_var: variance of each task's perturbation eps_i.
        input_std: std of the raw inputs x; None: 1/sqrt(in_dim (b_var + eps_var)) (unit-variance pre-activations).
        noise_std: std of iid observation noise added to every target entry (the paper has none).
        data_seed: seed of the data (the same data in every run).
        reference: single-task metrics {task: {metric: value}} for `mtl-bench report -b reference`.
        """
        if len(sigmas) == 0:
            raise ValueError("sigmas: need one scale per task, got none")
        for key, value in (
            ("n_train", n_train),
            ("n_val", n_val),
            ("n_test", n_test),
            ("in_dim", in_dim),
            ("out_dim", out_dim),
        ):
            if not value > 0:
                raise ValueError(f"{key}: must be > 0, got {value}")
        if input_std is None:
            input_std = 1.0 / math.sqrt(in_dim * (b_var + eps_var))
        gen = _generator(data_seed)
        b, eps = _draw_params(gen, len(sigmas), in_dim, out_dim, b_var, eps_var)
        # Effective per-task matrices, transposed once so each target is one matmul.
        weights_t = (b + eps).transpose(1, 2).contiguous()  # (T, in_dim, out_dim)
        sizes = {"train": n_train, "val": n_val, "test": n_test}
        # Draw every x before any noise, so noise_std does not change the inputs.
        inputs = {split: torch.randn(n, in_dim, generator=gen) * input_std for split, n in sizes.items()}
        splits = {}
        for split, x in inputs.items():
            targets = {}
            for i, sigma in enumerate(sigmas):
                y = float(sigma) * torch.tanh(x @ weights_t[i])
                if noise_std > 0:
                    y = y + noise_std * torch.randn(y.shape, generator=gen)
                targets[f"t{i}"] = y
            # The model sees standardised features (unit variance, as one would feed real data): with raw x
            # of std ~0.017 an MLP at default init barely moves in the first thousand steps.
            splits[split] = Split(inputs=x / input_std, targets=targets)
        tasks = [
            Task(name=f"t{i}", out_dim=out_dim, loss=mse_loss, metrics=mse_metrics, higher_is_better={"mse": False})
            for i in range(len(sigmas))
        ]
        super().__init__(tasks, (in_dim,), reference=reference, **splits)


def _generator(data_seed: int) -> Generator:
    return torch.Generator().manual_seed(data_seed)


def _draw_params(
    gen: Generator, n_tasks: int, in_dim: int, out_dim: int, b_var: float, eps_var: float
) -> tuple[Tensor, Tensor]:
    b = torch.randn(out_dim, in_dim, generator=gen) * math.sqrt(b_var)
    eps = torch.randn(n_tasks, out_dim, in_dim, generator=gen) * math.sqrt(eps_var)
    return b, eps
