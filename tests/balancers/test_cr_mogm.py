"""CR-MOGM: the EMA of the base's weights by hand, the parameters of torchjd 0.18's CRMOGMWeighting around
UPGrad and DualProj after 6 steps, resume and skipped steps, and the bases it refuses."""

from __future__ import annotations

import functools

import pytest
import torch

from mtl_bench.balancers import CRMOGM, MGDA
from mtl_bench.balancers.dualproj import DualProjWeighting
from mtl_bench.balancers.fairgrad import FairGradWeighting
from mtl_bench.balancers.mgda import MGDAWeighting
from mtl_bench.balancers.pcgrad import PCGradWeighting
from mtl_bench.balancers.upgrad import UPGradWeighting
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_resume_and_skip_keep_the_state,
    assert_same_parameters,
    batch,
    make_model,
    task_losses,
    train_ours,
    train_torchjd,
)


def build(model, **options) -> CRMOGM:
    return CRMOGM(list(TASKS3), list(model.trunk.parameters()), **options)


def test_weights_are_the_ema_of_the_base_weights():
    model = make_model()
    bal = build(model, base=MGDAWeighting(normalization="l2"), alpha=0.75)
    plain = MGDA(list(TASKS3), list(model.trunk.parameters()), normalization="l2")
    expected = None
    for step in range(3):
        x, y = batch(seed=step)
        out, losses = task_losses(model, x, y)
        raw = plain._solve(*_gram_and_losses(model, losses, out.shared)).weights  # frees this forward's graph
        out, losses = task_losses(model, x, y)
        expected = raw if expected is None else 0.75 * expected + 0.25 * raw
        metrics = bal.backward(losses, out.shared)
        torch.testing.assert_close(torch.stack([metrics[f"cr_mogm/raw/{t}"] for t in TASKS3]), raw)
        torch.testing.assert_close(torch.stack([metrics[f"weight/{t}"] for t in TASKS3]), expected)
        model.zero_grad()


def _gram_and_losses(model, losses, shared):
    from mtl_bench.gradient_engine.gramian import gramian
    from mtl_bench.gradient_engine.task_grads import task_jacobian

    params = list(model.trunk.parameters())
    ordered = [losses[t] for t in TASKS3]
    blocks, _ = task_jacobian(ordered, shared, params, None, {id(p) for p in params})
    return gramian(blocks), torch.stack([loss.detach() for loss in ordered])


@pytest.mark.parametrize(
    ("base", "weighting"), [(UPGradWeighting, "UPGradWeighting"), (DualProjWeighting, "DualProjWeighting")]
)
def test_matches_torchjd(base, weighting):
    aggregation = pytest.importorskip("torchjd.aggregation")
    pytest.importorskip("quadprog")
    ours, reference = make_model(), make_model()
    train_ours(ours, build(ours, base=base(), alpha=0.5), 6)
    wrapped = aggregation.CRMOGMWeighting(getattr(aggregation, weighting)(), alpha=0.5)
    train_torchjd(reference, aggregation.GramianWeightedAggregator(wrapped), 6)
    assert_same_parameters(ours, reference)


def test_resume_continues_and_a_skipped_step_keeps_the_state():
    saved = assert_resume_and_skip_keep_the_state(lambda model: build(model, base=DualProjWeighting(), alpha=0.5))
    assert set(saved) == {"weighting.lambdas", "weighting.started"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"base": "MGDA"}, "^base: must be a Weighting or a config node naming one"),
        ({"base": PCGradWeighting}, r"^base: PCGradWeighting has state of its own \(rng._extra_state\)"),
        ({"base": FairGradWeighting()}, "^base: FairGradWeighting does not weight whole task gradients"),
        ({"base": functools.partial(MGDAWeighting, normalization="x")}, "^base.normalization: 'x' is not one of"),
        ({"alpha": 2.0}, r"^alpha: must be a number in \[0, 1\]"),
    ],
)
def test_bad_options_fail_clearly(options, message):
    with pytest.raises(ValueError, match=message):
        build(make_model(), **options)
