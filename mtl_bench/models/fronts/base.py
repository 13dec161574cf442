"""What a preference-conditioned model (`model/front=<name>`) shares: a preference buffer and the wrapped model."""

from __future__ import annotations

from typing import Callable, Iterator, Optional, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.base import ModelOutput, MultiTaskModel

ModelFactory = Callable[..., MultiTaskModel]


class PreferenceModel(MultiTaskModel):
    """A multi-task model whose predictions depend on a preference r over the tasks (r_i >= 0, Σ r_i = 1, task
    order): one trained model answers every trade-off at test time.

    `set_preference(r)` sets the r every forward uses until the next call: the engine sets the balancer's r of
    the step before its forwards (the model sees the preference the objective weighs the losses by), and each
    ray before evaluating at it; a freshly built model answers at the simplex's centre (1/T each). The buffer is
    not saved in checkpoints: r is set from outside before every use.

    The wrapped model (`self.model`, built by the front from its factory) is any backbone with any
    architecture; subclasses say how r enters it.
    """

    preference: Tensor

    def __init__(self, tasks: Sequence[str]) -> None:
        nn.Module.__init__(self)  # the wrapped model's MultiTaskModel holds trunk and heads
        self.tasks = tuple(tasks)
        self.register_buffer("preference", torch.full((len(self.tasks),), 1.0 / len(self.tasks)), persistent=False)

    def set_preference(self, preference: Tensor) -> None:
        """r for the following forwards: (T,) in task order, non-negative, summing to 1."""
        if preference.shape != self.preference.shape:
            raise ValueError(
                f"preference: expected {len(self.tasks)} values (tasks {list(self.tasks)}), got shape "
                f"{tuple(preference.shape)}"
            )
        self.preference.copy_(preference.detach().to(self.preference))

    # The wrapped model's facts, for subclasses that do not change them.
    @property
    def inner(self) -> MultiTaskModel:
        return self.model  # type: ignore[return-value]

    @property
    def last_shared_layer(self) -> nn.Module:
        return self.inner.last_shared_layer

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        return self.inner.shared_parameters()

    def task_parameters(self, task: str) -> Iterator[nn.Parameter]:
        return self.inner.task_parameters(task)

    def shared_rep_problem(self) -> Optional[str]:
        return self.inner.shared_rep_problem()

    def set_progress(self, epoch: int, epochs: int) -> None:
        self.inner.set_progress(epoch, epochs)

    def measurements(self) -> dict[str, Tensor]:
        return self.inner.measurements()

    def forward(self, x: Tensor, tasks: Optional[Sequence[str]] = None) -> ModelOutput:
        raise NotImplementedError
