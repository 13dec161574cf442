"""COSMOS (Ruchte & Grabocka, ICDM 2021): the preference as extra input; as ruchtem/cosmos c198830
multi_objective/methods/cosmos/cosmos.py `Upsampler`."""

from __future__ import annotations

from typing import Iterator, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.base import ModelOutput
from mtl_bench.models.fronts.base import ModelFactory, PreferenceModel


class PreferenceUpsampler(nn.Module):
    """r (T,) to what is concatenated to a batch of inputs (N, ...): r itself per sample for vectors (N, F), or T
    feature maps for images (N, C, H, W), r through two transposed convolutions (4x4 stride 1, 6x6 stride 2, no
    bias, ReLU after each) resized to H x W by nearest upsampling, as COSMOS's `Upsampler`."""

    def __init__(self, tasks: int, input_shape: Sequence[int]) -> None:
        super().__init__()
        self.tasks = tasks
        self.image = len(input_shape) == 3
        if len(input_shape) not in (1, 3):
            raise ValueError(
                f"input_shape: cosmos appends the preference to vectors (F,) or images (C, H, W), got "
                f"{tuple(input_shape)!r}"
            )
        if self.image:
            self.transposed_cnn = nn.Sequential(
                nn.ConvTranspose2d(tasks, tasks, kernel_size=4, stride=1, padding=0, bias=False),
                nn.ReLU(inplace=True),
                nn.ConvTranspose2d(tasks, tasks, kernel_size=6, stride=2, padding=1, bias=False),
                nn.ReLU(inplace=True),
                nn.Upsample(tuple(int(s) for s in input_shape[-2:])),
            )

    def forward(self, x: Tensor, preference: Tensor) -> Tensor:
        n = x.shape[0]
        a = preference.to(x.dtype).repeat(n, 1)
        if self.image:
            a = self.transposed_cnn(a.reshape(n, self.tasks, 1, 1))
        return torch.cat((x, a), dim=1)


class COSMOS(PreferenceModel):
    """The wrapped model reads its input with the preference appended: one more input feature per task for
    vectors, one more channel per task for images (the model is built for that input shape, so any backbone and
    architecture takes it). Shared parameters: the upsampler's and the model's.

    Differences from the reference: none in the module; COSMOS's training draws r ~ Dir(1.2) per batch and trains
    on Σ r_i L_i − λ cos(r, L), which is `balancer=cosmos balancer.preference=dirichlet` here.
    """

    def __init__(self, model: ModelFactory, input_shape: Sequence[int], heads: Mapping[str, int]) -> None:
        """
        model: the wrapped model's factory (given by the engine: the `model` option with its architecture).
        input_shape: one sample's shape (given by the engine from the task set).
        heads: each task's output width (given by the engine from the task set).
        """
        super().__init__(list(heads))
        shape = tuple(int(s) for s in input_shape)
        self.upsampler = PreferenceUpsampler(len(heads), shape)
        self.model = model(input_shape=(shape[0] + len(heads), *shape[1:]), heads=heads)

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        yield from self.upsampler.parameters()
        yield from self.inner.shared_parameters()

    def forward(self, x: Tensor, tasks: Optional[Sequence[str]] = None) -> ModelOutput:
        return self.inner(self.upsampler(x, self.preference), tasks)
