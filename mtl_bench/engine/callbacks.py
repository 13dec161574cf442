"""The loop's one extension point, as Lightning's callbacks and torchtune's recipe hooks: a run-level feature (front
evaluation, gradient diagnostics, logging, model selection, preemption, a user's own under `callbacks:`) is a
`Callback` whose hooks the loop calls at fixed points. The loop knows the hooks, not the features.

Each hook gets the run (`engine.recipe.Recipe`: its step, parts, `logger`, `save`, `evaluate`). `Callbacks` calls
a hook only on the callbacks that override it, so a hook nobody overrides costs nothing per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from omegaconf import DictConfig

from mtl_bench.engine.builders import build, check_part, node_dict, target_of
from mtl_bench.errors import ConfigError

if TYPE_CHECKING:
    from mtl_bench.engine.recipe import Metrics, Recipe, TrainResult
    from mtl_bench.engine.step import StepResult

HOOKS = (
    "setup",  # end of Recipe.setup, after a resume's restore (all ranks; `run.is_main` writes files)
    "on_fit_start",  # before the first step of this session, after the initial test evaluation
    "on_step_start",  # before the step's forwards (also when a test or benchmark calls run.optimizer_step)
    "on_step_end",  # after the step and its log (`run.step` counts it); a stop signal is honoured here
    "on_log",  # at log steps: the scalars read from the device, each task's mean loss and the steps per second
    "on_eval_start",  # before an evaluation of the model as trained (not the front's rays)
    "on_eval",  # a split's metrics ("val", then "test" where it was evaluated)
    "on_eval_end",  # both: val and test (None where test was not evaluated)
    "on_checkpoint_or_eval_end",  # after a step that evaluated or wrote its periodic checkpoint
    "on_loop_end",  # after the last step, or on the way out of an error or a stop (always)
    "on_fit_end",  # the final result, which a callback may change (select=best_val reports another evaluation)
    "teardown",  # Recipe.cleanup
)


class Callback:
    """A run-level feature. Override the hooks it needs; `state_key`: the checkpoint entry its `state_dict()` is
    saved under and `load_state_dict` given back on resume (None: nothing saved)."""

    state_key: str | None = None

    def setup(self, run: Recipe) -> None: ...

    def on_fit_start(self, run: Recipe) -> None: ...

    def on_step_start(self, run: Recipe, logging_now: bool) -> None: ...

    def on_step_end(self, run: Recipe, result: StepResult, logging_now: bool) -> None: ...

    def on_log(self, run: Recipe, scalars: dict[str, float], losses: dict[str, float], rate: float) -> None: ...

    def on_eval_start(self, run: Recipe, split: str) -> None: ...

    def on_eval(self, run: Recipe, split: str, metrics: Metrics) -> None: ...

    def on_eval_end(self, run: Recipe, val: Metrics, test: Metrics | None) -> None: ...

    def on_checkpoint_or_eval_end(self, run: Recipe, logging_now: bool) -> None: ...

    def on_loop_end(self, run: Recipe) -> None: ...

    def on_fit_end(self, run: Recipe, result: TrainResult) -> None: ...

    def teardown(self, run: Recipe) -> None: ...

    def wants_test(self, step: int) -> bool:
        """Whether the evaluation at `step` should test as well (it always does at the last)."""
        return False

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class Callbacks:
    """The run's callbacks in order; `callbacks.on_step_end(run, ...)` calls each that overrides it."""

    setup: Callable[[Recipe], None]
    on_fit_start: Callable[[Recipe], None]
    on_step_start: Callable[[Recipe, bool], None]
    on_step_end: Callable[[Recipe, StepResult, bool], None]
    on_log: Callable[[Recipe, dict[str, float], dict[str, float], float], None]
    on_eval_start: Callable[[Recipe, str], None]
    on_eval: Callable[[Recipe, str, Metrics], None]
    on_eval_end: Callable[[Recipe, Metrics, Optional[Metrics]], None]
    on_checkpoint_or_eval_end: Callable[[Recipe, bool], None]
    on_loop_end: Callable[[Recipe], None]
    on_fit_end: Callable[[Recipe, TrainResult], None]
    teardown: Callable[[Recipe], None]
    wants_test: Callable[[int], bool]

    def __init__(self, callbacks: list[Callback], taken: tuple[str, ...] = ()) -> None:
        """`taken`: the checkpoint entries that are not a callback's (engine/checkpoint.py: RUN_STATE_KEYS)."""
        self.all = list(callbacks)
        keys = [c.state_key for c in self.all if c.state_key is not None]
        clash = sorted({k for k in keys if keys.count(k) > 1 or k in taken})
        if clash:
            raise ConfigError(
                f"callbacks: state_key {clash[0]!r} is taken (by another callback or the run's own checkpoint "
                f"entries: {', '.join(taken)}); give the callback another state_key"
            )
        self.overriding: dict[str, list[Any]] = {}  # hook -> the bound methods it calls
        for hook in (*HOOKS, "wants_test"):
            overriding = [getattr(c, hook) for c in self.all if getattr(type(c), hook) is not getattr(Callback, hook)]
            self.overriding[hook] = overriding
            setattr(self, hook, self._dispatch(overriding) if hook != "wants_test" else self._any(overriding))

    @staticmethod
    def _dispatch(methods: list[Any]) -> Any:
        if len(methods) <= 1:  # the per-step hooks mostly: no loop, or the one method itself
            return methods[0] if methods else _nothing

        def call(*args: Any) -> None:
            for method in methods:
                method(*args)

        return call

    @staticmethod
    def _any(methods: list[Any]) -> Any:
        return lambda step: any(method(step) for method in methods)

    def state_dict(self) -> dict[str, Any]:
        return {c.state_key: c.state_dict() for c in self.all if c.state_key is not None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for c in self.all:
            if c.state_key is not None and c.state_key in state:
                c.load_state_dict(state[c.state_key])


def _nothing(*args: Any) -> None:
    pass


def check_callbacks(cfg: DictConfig) -> None:
    """Each node under `callbacks:` (a user's own: +callbacks.<name>._target_=<class>) names a Callback subclass
    and takes its keys; one line naming the key otherwise, before anything is built."""
    nodes = cfg.get("callbacks")
    if nodes is None:
        return
    if not isinstance(nodes, DictConfig):
        raise ConfigError(f"callbacks={nodes!r}: expected callbacks by name (+callbacks.<name>._target_=<class>)")
    for name in map(str, nodes):
        node = nodes[name]
        if not isinstance(node, DictConfig) or "_target_" not in node:
            raise ConfigError(f"callbacks.{name}: expected a node with _target_ (a Callback subclass), got {node!r}")
        target = target_of(f"callbacks.{name}", node_dict(node))
        if not (isinstance(target, type) and issubclass(target, Callback)):
            raise ConfigError(
                f"callbacks.{name}._target_: {node._target_} is not a subclass of mtl_bench.engine.callbacks.Callback"
            )
        check_part(f"callbacks.{name}", node_dict(node))


def user_callbacks(cfg: DictConfig) -> list[Callback]:
    """The callbacks under `callbacks:`, in the order written."""
    nodes = node_dict(cfg.callbacks) if cfg.get("callbacks") else {}
    return [build(f"callbacks.{name}", node, Callback) for name, node in nodes.items()]
