"""The contract of a Gramian method: a weighting, weights from the tasks' Gramian (and losses, and its own state).

The gradient engine (`GramianBalancer`) gathers the per-task gradients, forms G = J Jᵀ and writes
d = Σ_i w_i g_i back; a weighting only turns G into w. A complete one (docs/library.md has it in a user's package):

    class InverseNorm(Weighting):
        def forward(self, gram, losses):
            return 1 / gram.diagonal().clamp_min(1e-12).sqrt()   # each task's gradient scaled to norm 1
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from torch import Tensor, nn

from mtl_bench.errors import ContractError

# What the engine hands a weighting's constructor, by name, when it asks for it (a config node that names such an
# argument is built by the engine: `_partial_: true`); everything else in the signature is an option.
WEIGHTING_ARGUMENTS = {
    "task_names": "the tasks, sorted (the order of the Gramian's rows and of the weights)",
    "listed_tasks": "the tasks in the order the task set lists them (where an option's default is 'the first task')",
    "blocks": "the number of blocks of J: one per shared parameter with grad_source=shared_params, 1 with shared_rep",
}


@dataclass
class Solution:
    """What a weighting returns (a plain (T,) tensor means `Solution(weights)`): the shared direction's weights
    (on the device, (T,), or one row per block (K, T) for a `per_block` weighting), the heads' weights (read when
    the weighting `weighs_heads`; None: 1 each), its measurements (0-d tensors by TensorBoard tag) and the new
    values of its buffers (`state`), which the balancer commits at its `step()` unless the step is skipped."""

    weights: Tensor
    head_weights: Optional[Tensor] = None
    metrics: dict[str, Tensor] = field(default_factory=dict)
    state: dict[str, Tensor] = field(default_factory=dict)


class Weighting(nn.Module):
    """A Gramian method: `forward(gram, losses)` returns the weights w of the tasks' gradients (a (T,) tensor or a
    `Solution`).

    `gram`: (T, T) float32, G = J Jᵀ of the unscaled gradients (the loss scale divided out), summed over the
    micro-batches of the step and averaged over DDP ranks; not finite on a step that will be skipped (return
    NaN weights or anything: nothing is written into the state). `losses`: (T,) the step's mean losses. Rows
    follow `task_names` sorted.

    State (EMA, counters, a generator) lives in buffers, so `state_dict()` and checkpoints hold it; a new value
    goes back in `Solution.state`. With a context (the engine's loop) the balancer commits it at `step(skipped)`,
    only when the optimizer step is taken; without one (a plain loop's `backward(losses, shared)`) at once. Two
    attributes, set by an option in `__init__`, ask the engine for more: `weighs_heads` (the heads' gradients
    wait for the solve and are weighted by `Solution.head_weights`: Nash-MTL's `head_weights=alpha`) and
    `per_block` (`forward` gets one Gramian per block of J, (K, T, T), and returns (K, T) weights: GradVac's
    `group=all_matrix`). The constructor may ask for `task_names`, `listed_tasks` and `blocks` (WEIGHTING_ARGUMENTS).
    """

    weighs_heads: bool = False
    per_block: bool = False
    HOST_SOLVE: str = ""  # what `forward` solves on the host, if anything (Balancer.HOST_SOLVE)

    def forward(self, gram: Tensor, losses: Tensor) -> Union[Tensor, Solution]:
        raise NotImplementedError


def as_solution(result: Union[Tensor, Solution]) -> Solution:
    return result if isinstance(result, Solution) else Solution(result)


def qualified_name(obj: Any) -> str:
    """`my_lab.weightings.Foo` of an object's class (how its config's `_target_` names it)."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def check_solution(solution: Solution, tasks: int, blocks: Optional[int], like: Tensor, who: str) -> None:
    """A weighting's (or aggregator's) result against the contract, once per step: shapes, dtypes and devices are
    metadata, so the check reads nothing from the device. `blocks`: K for a per-block result, else None; `like`: the
    Gramian (or a gradient block), whose device the weights must be on; `who`: the part, as its config names it.
    Raises ContractError (one line)."""
    weights = solution.weights
    wanted = f"({blocks}, {tasks})" if blocks is not None else f"({tasks},)"
    if not isinstance(weights, Tensor):
        raise ContractError(f"{who} returned {type(weights).__name__} weights; the contract: a {wanted} tensor")
    if not weights.is_floating_point():
        raise ContractError(f"{who} returned {weights.dtype} weights; the contract: a floating-point {wanted} tensor")
    if tuple(weights.shape) != ((blocks, tasks) if blocks is not None else (tasks,)):
        raise ContractError(
            f"{who} returned weights of shape {tuple(weights.shape)}; the contract: {wanted}, one per task"
            + (" per block (per_block)" if blocks is not None else "")
        )
    if weights.device != like.device:
        raise ContractError(f"{who} returned weights on {weights.device}; the Gramian is on {like.device}")
    heads = solution.head_weights
    if heads is not None and (not isinstance(heads, Tensor) or tuple(heads.shape) != (tasks,)):
        raise ContractError(f"{who} returned head_weights {shown(heads)}; the contract: None or a ({tasks},) tensor")
    check_measurements(solution.metrics, who, "metric")


def check_measurements(metrics: dict[str, Any], who: str, what: str = "measurement") -> None:
    """A part's measurements (a dict) against the contract: each a 0-d tensor (metadata only). Raises ContractError."""
    for tag, value in metrics.items():
        if not isinstance(value, Tensor) or value.dim() != 0:
            raise ContractError(f"{who} returned {what} {tag!r} as {shown(value)}; the contract: a 0-d tensor")


def shown(value: Any) -> Any:
    """A result as an error line shows it: a tensor's shape, else its type's name."""
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__


def build_weighting(
    weighting: Union[Weighting, Callable[..., Weighting]],
    task_names: Sequence[str],
    blocks: int,
    listed_tasks: Sequence[str],
    key: str = "weighting",
) -> Weighting:
    """A weighting as given (an instance), or built from a class or `functools.partial` (a config node with
    `_partial_: true`) with the WEIGHTING_ARGUMENTS its signature asks for."""
    if isinstance(weighting, Weighting):
        return weighting
    if not callable(weighting):
        raise ValueError(f"{key}: must be a Weighting or a config node naming one (_target_), got {weighting!r}")
    supplied: dict[str, Any] = {"task_names": list(task_names), "listed_tasks": list(listed_tasks), "blocks": blocks}
    params = inspect.signature(weighting).parameters
    given = weighting(**{k: v for k, v in supplied.items() if k in params})
    if not isinstance(given, Weighting):
        raise ValueError(f"{key}: {weighting!r} built a {type(given).__name__}, not a Weighting")
    return given
