"""engine/validation.py: a balancer declares that it needs validation data by a constructor argument `validation`,
and gets the engine's validation stream at build time; a user's own bilevel balancer, defined here, takes it in a
real run."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from mtl_bench.balancers import FORUM, MOML, AutoLambda, Balancer, FixedWeights, GradNorm, needs_validation
from mtl_bench.config import TrainerConf
from mtl_bench.engine.compose import validation_for
from mtl_bench.engine.recipe import train
from mtl_bench.engine.validation import ValidationStream
from mtl_bench.errors import ConfigError
from mtl_bench.tasks.base import Split
from tests.helpers.cli import SMALL

USER_BALANCER = f"{__name__}.ValidationLossWeights"


class ValidationLossWeights(Balancer):
    """A user's bilevel method: each task weighted by its share of the summed validation loss at the model's
    parameters moved by `shift` (a look-ahead without a gradient, enough to ask every method of the source)."""

    seen: list[dict] = []  # what each backward was handed (the test reads it after the run)

    def __init__(self, task_names, validation, shift: float = 0.01):
        super().__init__(task_names)
        self.validation, self.shift = validation, shift

    def backward(self, losses, shared, ctx=None):
        source = self.validation
        inputs, targets = source.training_batch()
        val_inputs, val_targets = source.next_validation_batch()
        ahead = {name: p.detach() + self.shift for name, p in source.trainable_parameters().items()}
        with torch.no_grad():
            val = source.task_losses(val_inputs, val_targets, ahead)
        total = sum(val.values())
        weights = {task: len(val) * val[task] / total for task in self.task_names}
        self.run_backward(sum(weights[t] * losses[t] for t in self.task_names), ctx)
        type(self).seen.append(
            {
                "source": source,
                "inputs": inputs,
                "val_inputs": val_inputs,
                "lr": source.learning_rate(),
                "same": source.task_losses(inputs, targets),
                "losses": {k: v.detach() for k, v in losses.items()},
            }
        )
        return {f"weight/{task}": w.detach() for task, w in weights.items()}


def test_a_balancer_needs_validation_when_its_signature_declares_it():
    for cls in (AutoLambda, MOML, FORUM, ValidationLossWeights):
        assert needs_validation(cls), cls
    for cls in (FixedWeights, GradNorm):
        assert not needs_validation(cls), cls


def test_a_users_bilevel_balancer_gets_the_engines_validation_stream(compose_cfg, tmp_path):
    ValidationLossWeights.seen = []
    overrides = [
        *SMALL,
        f"balancer._target_={USER_BALANCER}",
        "+balancer.shift=0.02",
        "trainer.validation_holdout=0.2",  # read: the balancer declares validation
        "trainer.max_steps=6",
        "optim.lr=0.004",
        "trainer.num_threads=1",
    ]
    result = train(compose_cfg(*overrides), tmp_path, overrides=overrides)
    assert result.step == 6
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["status"] == "completed"
    seen = ValidationLossWeights.seen
    assert len(seen) == 6 and all(isinstance(s["source"], ValidationStream) for s in seen)
    stream = seen[0]["source"]
    assert len(stream.data) == round(0.2 * 512)  # the held-out rows, out of the training split
    held = {tuple(row.tolist()) for row in stream.data.inputs}
    for s in seen:
        assert s["source"] is stream and s["lr"] == 0.004
        assert s["val_inputs"].shape[0] == 32 and {tuple(r.tolist()) for r in s["val_inputs"]} <= held
        assert not {tuple(r.tolist()) for r in s["inputs"]} & held  # never trained on
        torch.testing.assert_close(s["same"], s["losses"])  # task_losses without params: the step's own loss
    assert not torch.equal(seen[0]["val_inputs"], seen[1]["val_inputs"])  # the stream moves on each step


def test_the_engine_gives_validation_and_nothing_else_may(compose_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"^balancer\.validation: given by the engine at build time"):
        train(compose_cfg(*SMALL, "balancer=auto_lambda", "+balancer.validation=1"), tmp_path)


def test_a_bilevel_balancer_needs_a_source_with_every_method():
    class NoLearningRate:
        def training_batch(self): ...
        def next_validation_batch(self): ...
        def task_losses(self, inputs, targets, params=None): ...
        def trainable_parameters(self): ...

    with pytest.raises(ValueError, match="^validation: AutoLambda needs a mtl_bench.balancers.ValidationSource; "):
        AutoLambda(["a", "b"], validation=NoLearningRate())


def test_only_a_balancer_that_declares_validation_holds_rows_out():
    """compose.validation_for: the stream and its held-out rows for a bilevel class; None, and the training split
    untouched, for any other; a multi-input task set (per-task streams) has no validation stream yet."""

    def taskset():
        return SimpleNamespace(multi_input=False, train=Split(torch.randn(100, 2), {"a": torch.randn(100, 1)}))

    conf = TrainerConf(batch_size=8, validation_holdout=0.25)
    plain = taskset()
    assert validation_for(FixedWeights, conf, plain, seed=0) is None and len(plain.train) == 100
    bilevel = taskset()
    stream = validation_for(AutoLambda, conf, bilevel, seed=0)
    assert isinstance(stream, ValidationStream) and len(stream.data) == 25 and len(bilevel.train) == 75
    with pytest.raises(ConfigError, match="^tasks=SimpleNamespace: validation batches need a single-input task set"):
        validation_for(AutoLambda, conf, SimpleNamespace(multi_input=True), seed=0)
