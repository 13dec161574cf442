"""docs/tensorboard.md defines every tag a run writes ("Every tag"), one meaning per tag; the README promises only
what every run logs. Every balancer's tags are checked by tests/balancers/test_zoo.py on its runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtl_bench.engine.recipe import train
from tests.helpers.tag_docs import logged_tags, tag_patterns, undefined

ROOT = Path(__file__).resolve().parents[2]
SHORT = [
    "tasks=toy10",
    "tasks.n_train=256",
    "tasks.n_val=32",
    "tasks.n_test=32",
    "model.widths=[32,32]",
    "trainer=smoke",
    "trainer.max_steps=2",
    "trainer.log_every=1",
    "trainer.eval_every=2",
    "trainer.batch_size=32",
    "trainer.num_threads=1",
]
EVERY_RUN = {"loss", "weight", "metric", "lr", "grad_norm/total", "steps/skipped", "perf/steps_per_s"}


def test_the_table_defines_each_tag_once_and_the_families_of_tags_py():
    patterns = tag_patterns()
    assert len(patterns) >= 40
    import mtl_bench.tags as tags

    for tag in (tags.loss("t"), tags.weight("t"), tags.ratio("t"), tags.grad_norm("t"), tags.grad_cos("a", "b")):
        assert not undefined([tag]), tag
    for tag in (tags.metric("val", "t", "mse"), tags.lr(0), tags.momentum(0), tags.preference("t")):
        assert not undefined([tag]), tag
    for tag in (tags.GRAD_NORM_TOTAL, tags.LOSS_SCALE, tags.STEPS_PER_S, tags.STEPS_SKIPPED, tags.TEST_LOSS_RATIO_SUM):
        assert not undefined([tag]), tag
    assert undefined(["ratio/a/b", "nonsense/t0", "gradnorm/ratio/t0"]) == [
        "gradnorm/ratio/t0",
        "nonsense/t0",
        "ratio/a/b",
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["balancer=rescaled_norm"],
        ["balancer=gradnorm"],
        ["balancer=uw"],
        ["trainer.diagnostics=true", "trainer.diagnostics_every=1"],
        ["model/arch=mmoe"],
        ["model/arch=cross_stitch"],
        ["model/arch=cross_stitch", "model.arch.mixing=libmtl"],
        ["model/arch=ltb"],
        ["model/arch=ple"],
        ["model/arch=cgc"],
    ],
    ids=lambda o: " ".join(o) or "default",
)
def test_every_tag_a_run_writes_is_defined_in_the_docs(compose_cfg, tmp_path, overrides):
    train(compose_cfg(*SHORT, *overrides), tmp_path)
    written = logged_tags(tmp_path)
    assert not undefined(written), f"tags without a row in docs/tensorboard.md: {undefined(written)}"
    families = {
        tag.split("/")[0] if tag.split("/")[0] in {"loss", "weight", "metric", "lr"} else tag for tag in written
    }
    assert EVERY_RUN <= families


def test_gradnorm_and_rescaled_norm_name_their_shares_differently(compose_cfg, tmp_path):
    train(compose_cfg(*SHORT, "balancer=gradnorm"), tmp_path / "gradnorm")
    train(compose_cfg(*SHORT, "balancer=rescaled_norm"), tmp_path / "rescaled")
    gradnorm, rescaled = logged_tags(tmp_path / "gradnorm"), logged_tags(tmp_path / "rescaled")
    assert not any(t.startswith("ratio/") for t in gradnorm) and "gradnorm/norm_share/t0" in gradnorm
    assert "ratio/t0" in rescaled and not any(t.startswith("gradnorm/") for t in rescaled)


def test_the_readme_promises_only_tags_every_run_logs():
    """README's TensorBoard sentence names tags; each must be one every run writes (fixed and uw log no
    grad_norm/<task>)."""
    readme = (ROOT / "README.md").read_text()
    sentence = re.search(r"TensorBoard \(open http://localhost:6006\) shows(.*?)under\s+Custom Scalars", readme, re.S)
    assert sentence is not None
    promised = re.findall(r"`([a-z_]+/[^`]*)`", sentence.group(1))
    assert promised
    every = {"loss/<task>", "weight/<task>", "metric/<split>/<task>/<name>", "lr/<group>", "grad_norm/total"}
    assert set(promised) <= every, set(promised) - every
