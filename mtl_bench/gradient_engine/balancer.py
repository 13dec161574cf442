"""The balancer interface: turn per-task losses into gradients and report what it did."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from mtl_bench.errors import ContractError

# What the engine hands a balancer's constructor, by name, when the signature asks for it; everything
# else in the signature is an option set from config (`balancer.<name>=...`).
BUILD_ARGUMENTS = {
    "task_names": "the task set's task names (list[str])",
    "shared_params": "the model's shared parameters (list[nn.Parameter])",
    "shared_layer": "the model's last shared layer (nn.Module)",
    "world_size": "the number of DDP processes (int)",
    "initial_losses_known": "each task's theoretical initial loss or None (dict[str, float | None])",
    "validation": "the loop's batches, validation stream and task losses, for a bilevel method (ValidationSource)",
}


@dataclass
class BackwardContext:
    """What the training loop hands each backward besides the losses.

    `scaler`: fp16's GradScaler (None otherwise); `factor`: what every backward is multiplied by (1/k under
    gradient accumulation, so the accumulated gradient is the mean; NaN for a micro-batch whose loss is not
    finite, so that every gradient is and the step is skipped on the device); `accumulation_steps`: k, the
    number of `backward` calls (per task in per-task mode) before the step's `step()`.

    `epoch`: the index of the epoch the step belongs to (optimizer step // steps per epoch, from 0; set by the loop
    before each step, also after a resume), for methods whose schedule follows epochs (FORUM's λ average).

    `measure`: whether the loop reads this step's measurements (a logging step). When False a balancer may leave
    out work done only for them (a Gramian that only gives `grad_cos/...`, a pass that only gives `grad_norm/...`)
    and the keys they fill; the gradients it writes and the state it stages must not change.

    What only some methods need is given at build time instead: a bilevel method's batches, validation stream
    and task losses come from the `validation` argument it declares (balancers/validation_source.py).
    """

    scaler: Optional[torch.amp.GradScaler] = None
    factor: Union[Tensor, float] = 1.0
    accumulation_steps: int = 1
    epoch: int = 0
    measure: bool = True

    def scale(self, outputs: Tensor) -> Tensor:
        """What a backward runs on: `outputs` times the factor, times the loss scale."""
        outputs = outputs * self.factor
        return self.scaler.scale(outputs) if self.scaler is not None else outputs

    @staticmethod
    def of(ctx: "BackwardContext | torch.amp.GradScaler | None") -> "BackwardContext | None":
        """A GradScaler passed by a library user is a context with that scaler."""
        if ctx is None or isinstance(ctx, BackwardContext):
            return ctx
        return BackwardContext(scaler=ctx)


Context = Union[BackwardContext, torch.amp.GradScaler, None]


class Balancer(nn.Module):
    """Runs the backward of a multi-task step.

    Built with what it needs (see BUILD_ARGUMENTS: task names, the model's shared parameters or last shared
    layer, the world size, a bilevel method's validation source) plus its options. Each step,
    `backward(losses, shared, ctx)` decides the per-task weights (possibly from gradients measured at `shared`,
    the shared representation, or at the shared parameters), runs the backward (through `ctx.scale`), stages its
    state update and returns its measurements as 0-d tensors keyed by TensorBoard tag (`weight/<task>`,
    `grad_norm/<task>`, ...; see mtl_bench.tags). It never calls `.item()`: the loop reads the values only every
    `log_every` steps.

    Being an `nn.Module`, learnable state (GradNorm's weights) and running statistics (EMA buffers) are part
    of `state_dict()`, so checkpoints restore them.

    The step protocol::

        metrics = balancer.backward(losses, out.shared, ctx)   # joint mode: every task at once
        # per-task mode instead: balancer.backward_task(task, loss, out.shared, ctx) for each task
        scaler.step(optimizer); scaler.update()                # or optimizer.step()
        metrics |= balancer.step(skipped)                      # commit the staged update unless skipped

    With a context (the loop always passes one) state updates are staged and `step()` commits them, so a
    step the loop skips leaves the state unchanged; `step(None)` asks the context's grad scaler whether it
    skipped. Without a context (`backward(losses, shared)` from a plain loop) a joint backward commits at
    once and `step()` may be omitted. Under accumulation (`ctx.accumulation_steps = k`) the k backwards'
    statistics are averaged and `step()` commits one update from that mean. Statistics that are not finite
    never enter the state. Under DDP every rank must run the tasks in the same order.
    """

    task_names: list[str]
    # What the method computes on the host, where it does: on a GPU that solve's read of the device (one copy of
    # the Gramian or the program's data, after which the device queue is empty) is the step's one host
    # synchronisation. It happens inside the method named by HOST_SOLVE_IN; every other method never reads the
    # device in a step (tests/engine/test_host_sync.py checks both on the CPU; docs/methods.md lists them).
    HOST_SOLVE: str = ""
    HOST_SOLVE_IN: str = "_solve"
    # A 0-d bool on the device, set by a step whose weights were not finite though its Gramian and losses were (the
    # method's fault, not the data's); the engine records it per step and reads it where it reads the device anyway.
    nonfinite_weights: Optional[Tensor] = None

    def __init__(self, task_names: list[str]) -> None:
        task_names = task_list(type(self), task_names)
        super().__init__()
        if not task_names:
            raise ValueError("task_names: a balancer needs at least one task")
        self.task_names = list(task_names)

    @property
    def part_name(self) -> str:
        """The part as a user's error line names it: `balancer (my_lab.balancers.Mine)`."""
        return f"balancer ({type(self).__module__}.{type(self).__qualname__})"

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        # A random generator's state is the extra state of the `rng` module that holds it; a checkpoint that keeps it
        # as the balancer's own (or its weighting's) predates that.
        for key in state_dict:
            if key.startswith(prefix) and key.endswith("_extra_state"):
                path = key[len(prefix) : -len("_extra_state")].rstrip(".")
                owner = self.get_submodule(path) if path in dict(self.named_modules()) else None
                if owner is None or type(owner).get_extra_state is nn.Module.get_extra_state:
                    raise ContractError(
                        f"{self.part_name}: the checkpoint keeps a random generator's state as "
                        f"{key[len(prefix) :]!r}, a layout this version does not read (it is under rng.); start a "
                        "new run"
                    )
        super()._load_from_state_dict(state_dict, prefix, *args)

    def check_losses(self, losses: dict[str, Tensor]) -> None:
        """Losses must name exactly the balancer's tasks."""
        if set(losses) != set(self.task_names):
            raise KeyError(
                f"losses for tasks {sorted(losses)} do not match the balancer's tasks {sorted(self.task_names)}"
            )

    def backward(self, losses: dict[str, Tensor], shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        raise NotImplementedError

    def backward_task(self, task: str, loss: Tensor, shared: Tensor, ctx: Context = None) -> dict[str, Tensor]:
        """Per-task mode: the backward of one task's loss on its own batch (see the class docstring). A balancer
        without one raises with its per_task_problem's reason."""
        raise NotImplementedError(self.per_task_problem() or f"{type(self).__name__} has no per-task mode")

    def step(self, skipped: bool | Tensor | None = None) -> dict[str, Tensor]:
        """Commit the state update of this step unless the step was skipped; stateless balancers: no-op."""
        return {}

    def needed_accumulation_steps(self) -> Optional[int]:
        """The micro-batches per optimizer step this balancer takes when the user gives none
        (trainer.grad_accumulation_steps=null), or None when any number does (the engine then takes 1)."""
        return None

    def accumulation_problem(self, steps: int) -> Optional[str]:
        """Why this balancer cannot run with `steps` micro-batches per optimizer step, or None when it can; asked
        at build time, as per_task_problem."""
        return None

    def per_task_problem(self) -> Optional[str]:
        """Why this balancer cannot run per-task steps (one batch per task), or None when it can; the loop
        asks at build time so that the run stops in one line before training."""
        if type(self).backward_task is Balancer.backward_task:
            return f"{type(self).__name__} has no per-task mode"
        return None

    @staticmethod
    def run_backward(total: Tensor, ctx: Context) -> None:
        ctx = BackwardContext.of(ctx)
        (ctx.scale(total) if ctx is not None else total).backward()

    def extra_repr(self) -> str:
        return f"tasks={self.task_names}"


def task_list(cls: type, task_names: Sequence[str]) -> list[str]:
    """The task names as a list; a mapping there (EnCodec's weights, given to a balancer without weights, whose
    keys would become names without weights) is a TypeError naming what to pass."""
    if isinstance(task_names, Mapping):
        raise TypeError(old_constructor_form(cls, task_names))
    return list(task_names)


def weights_first(
    cls: type, task_names: Union[Sequence[str], Mapping[str, float], None], weights: Optional[Mapping[str, float]]
) -> tuple[list[str], Optional[Mapping[str, float]]]:
    """The task names and weights of a balancer that takes weights, with EnCodec's forms spelled out:
    `Balancer(weights)` and `Balancer(weights=...)` name the tasks by the mapping's keys. Options after the mapping
    go by name (EnCodec's positional options would land in `weights`: a TypeError says so)."""
    if isinstance(task_names, Mapping):
        if isinstance(weights, Mapping):
            raise TypeError(f"{cls.__name__}: weights given twice (the first argument and weights=)")
        if weights is not None:
            raise TypeError(
                f"{cls.__name__}: after a weights mapping, pass the options by name (got {weights!r} as the second "
                "argument)"
            )
        return list(task_names), dict(task_names)
    if task_names is None:
        if not isinstance(weights, Mapping):
            raise TypeError(f"{cls.__name__}: task_names: needed (or weights=, a mapping whose keys are the tasks)")
        return list(weights), weights
    return list(task_names), weights


def old_constructor_form(cls: type, names: Mapping[Any, Any]) -> str:
    """The TypeError message for a dict given where task names are expected: what to pass instead."""
    tasks = list(names)
    if "weights" in inspect.signature(cls).parameters:
        fix = f"{cls.__name__}({tasks!r}, weights={dict(names)!r})"
    else:
        fix = f"{cls.__name__}({tasks!r}) ({cls.__name__} takes no per-task weights)"
    return (
        f"{cls.__name__}: the first argument is the task names (a list of str), got a dict {dict(names)!r}; pass {fix}"
    )


def refuse_flat_state(balancer: Balancer, state_dict: dict, prefix: str, part: str = "weighting") -> None:
    """A method's state is saved under its part's name (`weighting.`, `aggregator.`); a checkpoint with flat names
    (`alpha`), or under a name that is none of the balancer's parts (a generator's `rng.` before it moved into the
    part), predates that and is refused in one line."""
    parts = {name for name, _ in balancer.named_children()}
    own = [key[len(prefix) :] for key in state_dict if key.startswith(prefix)]
    flat = [key for key in own if key.split(".", 1)[0] not in parts or "." not in key]
    if flat:
        raise ContractError(
            f"{balancer.part_name}: the checkpoint keeps the {part}'s state under flat names ({flat[0]!r}), a "
            "layout this version does not read; start a new run"
        )
