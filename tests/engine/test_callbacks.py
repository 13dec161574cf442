"""The loop's callbacks: a user's own, named on the command line, has its hooks called at the loop's points in a real
run and its state saved and restored with the checkpoint; a broken one is refused in one line before anything is
built; the loop calls only the hooks a callback overrides."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping

import pytest
import torch

from mtl_bench.engine.callbacks import HOOKS, Callback, Callbacks
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError

CALLS: list[tuple[Any, ...]] = []


class Recorder(Callback):
    """A user's callback: records each hook with the run's step, and counts its steps in its checkpointed state."""

    state_key = "recorder"

    def __init__(self, label: str = "none") -> None:
        self.label, self.steps = label, 0

    def setup(self, run: Any) -> None:
        CALLS.append(("setup", run.step, self.label))

    def on_fit_start(self, run: Any) -> None:
        CALLS.append(("fit_start", run.step))

    def on_step_end(self, run: Any, result: Any, logging_now: bool) -> None:
        self.steps += 1
        CALLS.append(("step_end", run.step, logging_now))

    def on_log(self, run: Any, scalars: dict[str, float], losses: dict[str, float], rate: float) -> None:
        CALLS.append(("log", run.step, sorted(losses), "loss/t0" in scalars))

    def on_eval(self, run: Any, split: str, metrics: Any) -> None:
        CALLS.append(("eval", run.step, split))

    def on_fit_end(self, run: Any, result: Any) -> None:
        CALLS.append(("fit_end", result.step, self.steps))

    def teardown(self, run: Any) -> None:
        CALLS.append(("teardown",))

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps = int(state["steps"])


USER = ["+callbacks.rec._target_=tests.engine.test_callbacks.Recorder", "+callbacks.rec.label=mine"]


def test_a_users_callback_from_the_command_line_sees_the_loop_and_resumes(small_conf, tmp_path):
    CALLS.clear()
    length = ("trainer.max_steps=6", "trainer.log_every=2", "trainer.eval_every=3", "trainer.checkpoint_every=3")
    train(small_conf(*length, *USER), tmp_path)
    assert CALLS[:2] == [("setup", 0, "mine"), ("fit_start", 0)]
    assert [c for c in CALLS if c[0] == "step_end"] == [("step_end", s, s % 2 == 0) for s in range(1, 7)]
    assert [c for c in CALLS if c[0] == "log"] == [("log", s, ["t0", "t1"], True) for s in (2, 4, 6)]
    assert [c for c in CALLS if c[0] == "eval"] == [("eval", 3, "val"), ("eval", 6, "val"), ("eval", 6, "test")]
    assert CALLS[-2:] == [("fit_end", 6, 6), ("teardown",)]
    saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert saved["recorder"] == {"steps": 6} and "selection" in saved  # beside the built-in selection's state

    CALLS.clear()  # two steps more: the state comes back from the checkpoint
    train(small_conf("trainer.max_steps=8", *length[1:], *USER, "trainer.resume=auto"), tmp_path)
    assert CALLS[0] == ("setup", 6, "mine")
    assert [c[1] for c in CALLS if c[0] == "step_end"] == [7, 8]
    assert ("fit_end", 8, 8) in CALLS


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "+callbacks.bad._target_=mtl_bench.loggers.CSVLogger",  # a logger is no callback
            "mtl_bench.loggers.CSVLogger is not a subclass of mtl_bench.engine.callbacks.Callback",
        ),
        ("+callbacks.bad._target_=my_lab.nowhere.Callback", "callbacks.bad._target_"),
        ("+callbacks.bad=3", "callbacks.bad: expected a node with _target_"),
    ],
)
def test_a_broken_callback_is_refused_in_one_line_before_the_build(small_conf, tmp_path, override, message):
    with pytest.raises(ConfigError) as err:
        train(small_conf(override), tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "checkpoints").exists()


def test_an_unknown_key_of_a_users_callback_is_refused(small_conf, tmp_path):
    with pytest.raises(ConfigError, match=r"callbacks\.rec\.lable"):
        train(small_conf(*USER[:1], "+callbacks.rec.lable=x"), tmp_path)


def test_the_loop_calls_only_the_hooks_a_callback_overrides():
    class OneHook(Callback):
        def on_log(self, run: Any, scalars: Any, losses: Any, rate: float) -> None:
            CALLS.append(("one",))

    callbacks = Callbacks([Callback(), OneHook(), Recorder()])
    assert {hook: len(methods) for hook, methods in callbacks.overriding.items() if methods} == {
        "setup": 1,
        "on_fit_start": 1,
        "on_step_end": 1,
        "on_log": 2,
        "on_eval": 1,
        "on_fit_end": 1,
        "teardown": 1,
    }
    assert set(HOOKS) | {"wants_test"} == set(callbacks.overriding)
    CALLS.clear()
    callbacks.on_log(SimpleNamespace(step=5), {}, {"t0": 1.0}, 1.0)
    assert CALLS == [("one",), ("log", 5, ["t0"], False)]
    assert callbacks.wants_test(3) is False


def test_a_state_key_that_is_taken_is_refused_in_one_line():
    from mtl_bench.engine.checkpoint import RUN_STATE_KEYS

    with pytest.raises(ConfigError, match="^callbacks: state_key 'recorder' is taken"):
        Callbacks([Recorder(), Recorder()])

    class Model(Recorder):
        state_key = "model"

    with pytest.raises(ConfigError, match="^callbacks: state_key 'model' is taken"):
        Callbacks([Model()], taken=RUN_STATE_KEYS)
