"""The engine of every Gramian method: a `Weighting` of the Gramian of the per-task gradients, as a balancer."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Literal, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from mtl_bench.balancers.weighting import (
    WEIGHTING_ARGUMENTS,
    Solution,
    Weighting,
    as_solution,
    build_weighting,
    qualified_name,
    shown,
)
from mtl_bench.errors import ContractError
from mtl_bench.gradient_engine.gradient_balancer import GRAD_SOURCES, GradientBalancer
from mtl_bench.gradient_engine.gramian import gramian
from mtl_bench.gradient_engine.rank_average import rank_mean

PREFIX = "weighting."


class GramianBalancer(GradientBalancer):
    """d = Σ_i w_i g_i with w given by a `Weighting` of G = J Jᵀ (the contract: mtl_bench/balancers/weighting.py).

    The gradient engine (`GradientBalancer`) does the rest: the per-task gradients at the shared parameters or the
    shared representation, the loss scale, accumulation, per-task steps, DDP, the heads. A user's weighting runs
    from config as `balancer=gramian balancer.weighting._target_=my_lab.MyWeighting`. A method of mtl-bench is
    this class with its weighting fixed, `class UPGrad(GramianBalancer, weighting=UPGradWeighting)`, whose
    constructor takes the weighting's options as its own (`UPGrad(tasks, params, norm_eps=1e-4)`,
    `balancer.norm_eps=...`).

    The weighting's buffers are this balancer's state under their own names (`alpha`, not `weighting.alpha`: the
    checkpoints of the methods from before they were weightings still load); its options and state read through
    the balancer too (`balancer.alpha`).
    """

    weighting: Weighting
    _sources: tuple[str, ...] = GRAD_SOURCES  # a method's: `class UPGrad(..., sources=("shared_params",))`
    weighting_class: Optional[type[Weighting]] = None  # a method's: `class UPGrad(..., weighting=UPGradWeighting)`

    def __init__(
        self,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        weighting: Union[Weighting, Callable[..., Weighting], None] = None,
        grad_source: Literal["shared_params", "shared_rep"] = "shared_params",
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_params: the model's shared parameters (given by the engine).
        weighting: the Weighting, or a config node naming one (`_target_`; `_partial_: true` when its constructor
            takes task_names or blocks, which the engine then supplies).
        grad_source: shared_params (exact per-task gradients) or shared_rep (gradients at the shared
            representation: one small backward per task, exact where that representation is a cut).
        """
        listed = list(task_names)
        super().__init__(task_names, shared_params, grad_source)
        if weighting is None:
            raise ValueError("weighting: needs a Weighting (a config node with its _target_)")
        blocks = len(self._params) if grad_source == "shared_params" else 1
        self.weighting = build_weighting(weighting, self.task_names, blocks, listed)
        self.heads_wait = self.weighting.weighs_heads
        self.HOST_SOLVE = self.weighting.HOST_SOLVE  # the weighting's (a user's, with balancer=gramian)
        self._register_state_dict_hook(_without_prefix)
        self._register_load_state_dict_pre_hook(self._with_prefix)

    def __init_subclass__(
        cls, weighting: Optional[type[Weighting]] = None, sources: Sequence[str] = GRAD_SOURCES, **kwargs: Any
    ) -> None:
        if weighting is not None:
            cls._sources, cls.weighting_class = tuple(sources), weighting
            cls.HOST_SOLVE = weighting.HOST_SOLVE
            cls.__init__ = _method_init(cls, weighting, cls._sources)  # type: ignore[method-assign]
        super().__init_subclass__(**kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            weighting = self.__dict__["_modules"].get("weighting")
            if weighting is None or name.startswith("__"):
                raise
            return getattr(weighting, name)

    def extra_repr(self) -> str:
        return f"tasks={self.task_names}, grad_source={self.grad_source}"

    def _step_gramian(self, blocks: Sequence[Tensor], scale: Optional[Tensor]) -> Optional[Tensor]:
        if not self.weighting.per_block:
            return self._unscaled_gramian(blocks, scale)
        grams = torch.stack([gramian([block]) for block in blocks])
        self._block_grams = rank_mean(grams / (scale * scale) if scale is not None else grams)
        return self._block_grams.sum(0)

    @property
    def part_name(self) -> str:
        """A method of mtl-bench is the balancer; under balancer=gramian the weighting is the user's part."""
        if self.weighting_class is not None:
            return super().part_name
        return f"balancer.weighting ({qualified_name(self.weighting)})"

    def _solve(self, gram: Tensor, losses: Tensor) -> Solution:
        solution = as_solution(self.weighting(self._block_grams if self.weighting.per_block else gram, losses))
        if solution.state:
            buffers = self.weighting._buffers
            for name, value in solution.state.items():
                kept = buffers.get(name)
                if kept is None or not isinstance(value, Tensor) or value.shape != kept.shape:
                    wanted = (
                        f"shape {tuple(kept.shape)}" if kept is not None else f"one of {sorted(buffers) or '(none)'}"
                    )
                    raise ContractError(
                        f"{self.part_name} returned state {name!r} {shown(value)}; the contract: a new value of one "
                        f"of its buffers, {wanted}"
                    )
            self._stage(**{PREFIX + name: value for name, value in solution.state.items()})
        return solution

    def _with_prefix(self, state_dict: dict, prefix: str, *args: Any) -> None:
        """Loading: the flat names of the weighting's state back under `weighting.`."""
        for key in list(state_dict):
            if key.startswith(prefix) and not key.startswith(prefix + PREFIX):
                state_dict[prefix + PREFIX + key[len(prefix) :]] = state_dict.pop(key)


def _without_prefix(module: Any, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    """Saving: the weighting's state under its own names (the engine keeps no state of its own)."""
    for key in list(state_dict):
        if key.startswith(prefix + PREFIX):
            state_dict[prefix + key[len(prefix + PREFIX) :]] = state_dict.pop(key)


def _method_init(cls: type, weighting: type[Weighting], sources: tuple[str, ...]) -> Callable[..., None]:
    """The constructor of a method with its weighting fixed: the engine's arguments, then the weighting's options
    (its signature and docstring, so config checks and docs see them as the method's own). A method with one source
    has no grad_source argument (a key with one legal value): its gradients are taken there."""

    def either(
        self: GramianBalancer,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        grad_source: str = sources[0],
        **options: Any,
    ) -> None:
        GramianBalancer.__init__(self, task_names, shared_params, _Options(weighting, options), grad_source)  # type: ignore[arg-type]

    def one(
        self: GramianBalancer,
        task_names: Sequence[str],
        shared_params: Optional[Iterable[Tensor]] = None,
        **options: Any,
    ) -> None:
        GramianBalancer.__init__(self, task_names, shared_params, _Options(weighting, options), sources[0])  # type: ignore[arg-type]

    __init__: Any = either if len(sources) > 1 else one
    try:
        own = inspect.signature(weighting, eval_str=True)
    except Exception:
        own = inspect.signature(weighting)
    engine = [p for p in inspect.signature(__init__, eval_str=True).parameters.values() if p.name != "options"]
    if len(sources) > 1:
        engine[3] = engine[3].replace(annotation=Literal[sources])  # the sources the method allows
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)  # not nn.Module's *args
    options = [p for name, p in own.parameters.items() if name not in WEIGHTING_ARGUMENTS and p.kind in plain]
    __init__.__signature__ = inspect.Signature([*engine, *options])
    where = (
        "grad_source: shared_params (exact per-task gradients) or shared_rep (gradients at the shared representation)"
        if len(sources) > 1
        else f"The gradients are taken at {sources[0]} only, as in the method's reference (no grad_source option)"
    )
    engine_doc = (
        "task_names: the tasks (given by the engine).\n"
        "shared_params: the model's shared parameters (given by the engine).\n"
        f"{where}.\n"
    )
    own_doc = inspect.getdoc(weighting.__init__) if weighting.__init__ is not nn.Module.__init__ else ""
    __init__.__doc__ = engine_doc + (own_doc or "")
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


class _Options:
    """The weighting of a method built with the options its constructor was given (and the engine's arguments it
    asks for)."""

    def __init__(self, weighting: type[Weighting], options: dict[str, Any]) -> None:
        self.weighting, self.options = weighting, options
        self.__signature__ = inspect.signature(weighting)

    def __call__(self, **supplied: Any) -> Weighting:
        return self.weighting(**supplied, **self.options)
