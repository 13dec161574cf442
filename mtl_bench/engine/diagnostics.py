"""Gradient diagnostics any balancer can turn on (`trainer.diagnostics=true`) without changing its update:
each task's gradient at the shared parameters, measured by its own extra backward at diagnostic steps only,
gives `grad_norm/<task>`, `grad_cos/<a>/<b>` and a heatmap of the cosines."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from mtl_bench import tags


class GradientDiagnostics:
    """Collects each task's gradient of the shared parameters (unweighted, unscaled) during one step."""

    def __init__(self, shared_params: list[nn.Parameter], task_names: list[str]) -> None:
        self.params = [p for p in shared_params if p.requires_grad]
        self.task_names = task_names
        self.grads: dict[str, Tensor] = {}

    def record(self, task: str, loss: Tensor) -> None:
        """One extra backward of `loss` alone (the graph is kept for the balancer's own backward)."""
        grads = torch.autograd.grad(loss, self.params, retain_graph=True, allow_unused=True)
        self.grads[task] = torch.cat(
            [(g if g is not None else torch.zeros_like(p)).reshape(-1).float() for g, p in zip(grads, self.params)]
        )

    def measurements(self) -> dict[str, Tensor]:
        """grad_norm/<task>, grad_cos/<a>/<b> (a before b in task order) and the cosine matrix under
        `grad_cos/matrix` (read by the loop for the heatmap); on the device."""
        names = [name for name in self.task_names if name in self.grads]
        if not names:
            return {}
        g = torch.stack([self.grads[name] for name in names])
        gram = g @ g.T
        norms = gram.diagonal().clamp_min(0).sqrt()
        cos = gram / (norms[:, None] * norms[None, :]).clamp_min(1e-12)
        self.grads.clear()
        out = {tags.grad_norm(name): norms[i] for i, name in enumerate(names)}
        for i, a in enumerate(names):
            for j in range(i + 1, len(names)):
                out[tags.grad_cos(a, names[j])] = cos[i, j]
        out[GRAD_COS_MATRIX] = cos
        return out


GRAD_COS_MATRIX = "grad_cos/matrix"


def heatmap(cos: np.ndarray, cell: int = 16) -> np.ndarray:
    """A (3, H, W) float image of a cosine matrix: red for +1, white for 0, blue for -1; one square per pair."""
    c = np.clip(cos, -1.0, 1.0)
    red = np.where(c < 0, 1 + c, 1.0)
    blue = np.where(c > 0, 1 - c, 1.0)
    green = 1 - np.abs(c)
    image = np.stack([red, green, blue])
    return image.repeat(cell, axis=1).repeat(cell, axis=2)
