"""Every balancer option trains through the engine on tasks=toy10 and tasks=digits, logs weight/<task> for
every task and only tags docs/tensorboard.md defines, and (methods with state) resumes from its checkpoint."""

from __future__ import annotations

import json

import pytest

from mtl_bench.catalog import config_options
from mtl_bench.engine.recipe import train
from tests.helpers.tag_docs import logged_tags, undefined

BALANCERS = config_options()["balancer"]
TASK_SETS = {
    "toy10": ["tasks=toy10", "tasks.n_train=256", "tasks.n_val=32", "tasks.n_test=32", "model.widths=[32,32]"],
    "digits": ["tasks=digits", "model=lenet", "tasks.n_train=256", "tasks.n_val=32", "tasks.n_test=32"],
}
# modo and sdmgrad take their 3 micro-batches without a key (trainer.grad_accumulation_steps: null).
# A bilevel method's validation batch is a training batch's size: 0.2 of 256 rows holds out 51 >= 32.
EXTRA = {name: ["trainer.validation_holdout=0.2"] for name in ("auto_lambda", "moml", "forum")}
SHORT = ["trainer=smoke", "trainer.max_steps=6", "trainer.log_every=3", "trainer.eval_every=6", "trainer.batch_size=32"]


@pytest.mark.parametrize("tasks", sorted(TASK_SETS))
@pytest.mark.parametrize("balancer", BALANCERS)
def test_every_balancer_trains_on_both_task_sets(compose_cfg, tmp_path, balancer, tasks):
    cfg = compose_cfg(f"balancer={balancer}", *TASK_SETS[tasks], *SHORT, *EXTRA.get(balancer, []))
    result = train(cfg, tmp_path)
    assert result.step == 6
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "completed"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    for task in metrics["test"]:
        values = [e.value for e in events.Scalars(f"weight/{task}")]
        assert len(values) == 2 and all(v == v for v in values), (task, values)  # logged at steps 3, 6; not NaN
    written = logged_tags(tmp_path)
    assert not undefined(written), f"tags without a row in docs/tensorboard.md: {undefined(written)}"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["balancer=famo"], "trainer.step_mode=per_task: FAMO has no per-task mode"),
        (
            ["balancer=mgda", "balancer.grad_source=shared_rep"],
            "trainer.step_mode=per_task: MGDA: grad_source=shared_rep has no per-task mode",
        ),
    ],
)
def test_a_meaningless_combination_stops_at_build_time(compose_cfg, tmp_path, overrides, message):
    from mtl_bench.errors import ConfigError

    cfg = compose_cfg(*overrides, *TASK_SETS["toy10"], *SHORT, "trainer.step_mode=per_task")
    with pytest.raises(ConfigError, match=message):
        train(cfg, tmp_path)
    assert not list(tmp_path.glob("events.out.tfevents.*"))  # stopped before any training or logging


@pytest.mark.parametrize("balancer", ["fixed", "uw", "pcgrad"])
def test_diagnostics_log_gradient_norms_cosines_and_a_heatmap_without_changing_the_update(
    compose_cfg, tmp_path, balancer
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = [f"balancer={balancer}", *TASK_SETS["digits"], *SHORT, "trainer.diagnostics_every=3"]
    plain = train(compose_cfg(*args), tmp_path / "plain")
    seen = train(compose_cfg(*args, "trainer.diagnostics=true"), tmp_path / "seen")
    assert seen.test == plain.test  # the update is the same
    events = EventAccumulator(str(tmp_path / "seen"), size_guidance={"images": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"grad_norm/left", "grad_cos/left/right", "grad_cos/left/sum", "grad_cos/right/sum"} <= scalars
    cos = [e.value for e in events.Scalars("grad_cos/left/right")]
    assert len(cos) == 2 and all(-1 <= c <= 1 for c in cos)
    assert [e.step for e in events.Images("grad_cos/heatmap")] == [3, 6]
