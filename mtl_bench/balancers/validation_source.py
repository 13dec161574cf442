"""What a bilevel balancer sees of the training loop: its batches, a validation stream, the model's task losses.

A balancer declares that it needs validation data by a constructor argument `validation`; the engine then builds
it with its own implementation of `ValidationSource` (mtl_bench/engine/validation.py). A library user's own loop
passes any object with these five methods.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Optional, Protocol

from torch import Tensor

Batch = tuple[Any, dict[str, Tensor]]  # (inputs, {task: targets}), on the model's device


class ValidationSource(Protocol):
    """The loop's side of a bilevel method (Auto-λ, MOML, FORUM), asked from inside the step (its balancer's `backward`,
    where their on-graph weighting's `forward` runs)."""

    def training_batch(self) -> Batch:
        """This micro-batch's training (inputs, targets): the batch whose losses `backward` received."""
        ...

    def next_validation_batch(self) -> Batch:
        """The next (inputs, targets) of the validation stream; a second call in the same micro-batch takes the
        batch after it. The engine draws them by the step alone, so a resumed run draws the same ones."""
        ...

    def task_losses(
        self, inputs: Any, targets: dict[str, Tensor], params: Optional[Mapping[str, Tensor]] = None
    ) -> dict[str, Tensor]:
        """Each task's loss (float32) of the model on a batch. With `params` ({name: tensor}, some or all of
        `trainable_parameters()`), of the model at those parameters, leaving its buffers (BatchNorm statistics)
        as they were; without, of the model itself (its forward may update them)."""
        ...

    def trainable_parameters(self) -> dict[str, Tensor]:
        """The model's parameters that the optimizer trains, by name (the same dict every call)."""
        ...

    def learning_rate(self) -> float:
        """The optimizer's current lr (its first param group's)."""
        ...


def needs_validation(balancer: Callable[..., Any]) -> bool:
    """Whether a balancer class (or factory) declares a `validation` argument: the engine then gives it a
    ValidationSource at build time, and reads the trainer's validation keys."""
    try:
        return "validation" in inspect.signature(balancer).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): it declares nothing
        return False


def require_validation(owner: str, validation: Optional[ValidationSource]) -> ValidationSource:
    """`validation` itself, or one ValueError naming the argument when a balancer that needs it got none (or an
    object without ValidationSource's methods)."""
    if validation is None:
        raise ValueError(
            f"validation: {owner} learns on validation batches; pass an object with the methods of "
            "mtl_bench.balancers.ValidationSource (the engine passes its own; see docs/bilevel.md)"
        )
    missing = [name for name in METHODS if not callable(getattr(validation, name, None))]
    if missing:
        raise ValueError(
            f"validation: {owner} needs a mtl_bench.balancers.ValidationSource; {type(validation).__name__} has no "
            f"{', '.join(missing)}"
        )
    return validation


METHODS = tuple(name for name in vars(ValidationSource) if not name.startswith("_"))  # the Protocol's own
