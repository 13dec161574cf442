"""Gradient diagnostics any balancer can turn on (`trainer.diagnostics=true`) without changing its update:
each task's gradient at the shared parameters, measured by its own extra backward at diagnostic steps only,
gives `grad_norm/<task>`, `grad_cos/<a>/<b>` and a heatmap of the cosines. `Diagnostics` is the loop's callback:
it hands the step its collector every `trainer.diagnostics_every` log steps and logs the heatmap."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from mtl_bench import tags
from mtl_bench.engine.callbacks import Callback

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import Recipe
    from mtl_bench.engine.step import StepResult


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


class Diagnostics(Callback):
    """trainer.diagnostics=true: each task's gradient measured at log steps, every trainer.diagnostics_every."""

    def __init__(self, every: int) -> None:
        self.every = every

    def setup(self, run: Recipe) -> None:
        self.diagnostics = GradientDiagnostics(list(run.model.shared_parameters()), run.taskset.task_names)

    def on_step_start(self, run: Recipe, logging_now: bool) -> None:
        run.diagnose = self.diagnostics if logging_now and (run.step + 1) % self.every == 0 else None

    def on_step_end(self, run: Recipe, result: StepResult, logging_now: bool) -> None:
        cos = result.measurements.pop(GRAD_COS_MATRIX, None) if logging_now else None
        if cos is not None and run.logger is not None:  # one image per diagnostic step
            run.logger.log_image(
                "grad_cos/heatmap", heatmap(cos.float().cpu().numpy(), run.taskset.task_names), run.step
            )


def colour(c: np.ndarray) -> np.ndarray:
    """RGB in [0, 1] for cosines (..., 3): red for +1, white for 0, blue for -1."""
    c = np.clip(c, -1.0, 1.0)
    return np.stack([np.where(c < 0, 1 + c, 1.0), 1 - np.abs(c), np.where(c > 0, 1 - c, 1.0)], axis=-1)


def heatmap(cos: np.ndarray, names: list[str] | None = None, cell: int | None = None) -> np.ndarray:
    """A (3, H, W) float image of a cosine matrix for TensorBoard: one square per pair of tasks, labelled with the
    task names (rows and columns), the value written in each square when there is room, and a colour scale from
    -1 (blue) through 0 (white) to +1 (red) on the right. Squares are 48 px for a few tasks, smaller for many
    (the grid stays within about 960 px)."""
    from PIL import Image, ImageDraw, ImageFont

    n = cos.shape[0]
    names = list(names) if names is not None and len(names) == n else [str(i) for i in range(n)]  # never mislabel
    cell = cell or max(16, min(48, 960 // max(n, 1)))
    try:
        font = ImageFont.load_default(size=max(10, min(14, cell // 3)))
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    text_w = max(int(measure.textlength(name, font=font)) for name in names) + 8
    bar_w, pad = 16, 8
    width, height = text_w + n * cell + pad + bar_w + 40, text_w + n * cell + pad
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    x0, y0 = text_w, text_w
    rgb = (colour(cos) * 255).round().astype(np.uint8)
    for i in range(n):
        for j in range(n):
            box = (x0 + j * cell, y0 + i * cell, x0 + (j + 1) * cell - 1, y0 + (i + 1) * cell - 1)
            draw.rectangle(box, fill=tuple(int(v) for v in rgb[i, j]), outline=(200, 200, 200))
            if cell >= 32:
                draw.text(
                    (box[0] + cell / 2, box[1] + cell / 2), f"{cos[i, j]:+.2f}", fill="black", font=font, anchor="mm"
                )
    for i, name in enumerate(names):  # row labels on the left, column labels written upwards on top
        draw.text((x0 - 4, y0 + i * cell + cell / 2), name, fill="black", font=font, anchor="rm")
        label = Image.new("RGB", (text_w, cell), "white")
        ImageDraw.Draw(label).text((4, cell / 2), name, fill="black", font=font, anchor="lm")
        image.paste(label.rotate(90, expand=True), (x0 + i * cell, 0))
    bar_x, bar_h = x0 + n * cell + pad, n * cell
    ramp = colour(np.linspace(1.0, -1.0, bar_h))  # +1 at the top
    bar = Image.fromarray((np.repeat(ramp[:, None, :], bar_w, axis=1) * 255).round().astype(np.uint8))
    image.paste(bar, (bar_x, y0))
    for value, y in ((1, y0), (0, y0 + bar_h / 2), (-1, y0 + bar_h - 1)):
        draw.text((bar_x + bar_w + 4, y), f"{value:+d}" if value else "0", fill="black", font=font, anchor="lm")
    return np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0
