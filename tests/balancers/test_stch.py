"""SmoothTchebycheff (STCH): the weights by hand, the parameters of torchjd 0.18's STCH after 6 steps and of LibMTL
main's STCH with its warm-up after 7 (numbers taken from it), the warm-up state on resume."""

from __future__ import annotations

import math

import pytest
import torch

from mtl_bench.balancers import SmoothTchebycheff
from tests.helpers.balancer_kit import (
    TASKS3,
    assert_resume_and_skip_keep_the_state,
    assert_same_parameters,
    make_model,
    train_ours,
    train_scalarizer,
)


def test_weights_by_hand():
    # λ = (1, 2), z = (0, 1), L = (3, 2): λ(L − z) = (3, 2); w = λ ⊙ softmax((3, 2)/μ), μ = 1.
    shared = torch.zeros(1, requires_grad=True)
    bal = SmoothTchebycheff(["a", "b"], mu=1.0, preference={"a": 1.0, "b": 2.0}, reference={"a": 0.0, "b": 1.0})
    metrics = bal.backward({"a": (3.0 + shared).sum(), "b": (2.0 + shared).sum()}, shared)
    soft = [math.e**3 / (math.e**3 + math.e**2), math.e**2 / (math.e**3 + math.e**2)]
    assert [metrics["weight/a"].item(), metrics["weight/b"].item()] == pytest.approx([soft[0], 2 * soft[1]])


@pytest.mark.parametrize("mu", [0.05, 1.0])
def test_matches_torchjd_stch(mu):
    scalarization = pytest.importorskip("torchjd.scalarization")
    pref = {"a": 0.2, "b": 0.3, "c": 0.5}
    ref = {"a": 0.1, "b": 0.0, "c": -0.2}
    ours, reference = make_model(), make_model()
    train_ours(ours, SmoothTchebycheff(list(TASKS3), mu=mu, preference=pref, reference=ref), 6)
    jd = scalarization.STCH(mu, torch.tensor(list(pref.values())), torch.tensor(list(ref.values())))
    train_scalarizer(reference, jd, 6)
    assert_same_parameters(ours, reference)


def test_default_preference_is_torchjds():
    scalarization = pytest.importorskip("torchjd.scalarization")
    ours, reference = make_model(), make_model()
    train_ours(ours, SmoothTchebycheff(list(TASKS3)), 6)
    train_scalarizer(reference, scalarization.STCH(0.1), 6)
    assert_same_parameters(ours, reference)


# LibMTL main (github.com/median-research-group/LibMTL, commit 4336804847eaa5e0b924b743d76beec7ac3fdc97),
# LibMTL/weighting/STCH.py with that commit's abstract_weighting.py, on tests.helpers.balancer_kit's make_model()
# (the trunk as LibMTL's encoder) and batches, SGD lr 0.1, 7 steps of backward(losses, STCH_mu=0.5,
# STCH_warmup_epoch=1) with epoch = step // 2 (2 steps per epoch: 4 warm-up steps, the last 2 give the nadir point).
STCH_MAIN_PARAMS_AFTER_7 = {
    "trunk.0.weight": [
        0.0169840436,
        0.351536632,
        -0.519528031,
        -0.399292827,
        -0.241768092,
        0.166295677,
        -0.0437810607,
        0.412002712,
        -0.0559180006,
        0.136762723,
        -0.111661352,
        -0.16824095,
    ],
    "trunk.0.bias": [-0.49764365, -0.36072883, -0.314077675, 0.00608304096],
    "trunk.2.weight": [
        0.153459802,
        0.194500655,
        -0.312178373,
        -0.242853284,
        0.166634753,
        0.46010223,
        -0.161073729,
        0.413730264,
        -0.101190545,
        0.127268344,
        0.423398852,
        -0.457836002,
        -0.279668391,
        -0.0919661075,
        -0.131570145,
        0.389419407,
        -0.371639162,
        -0.184581056,
        -0.414716303,
        -0.438498884,
    ],
    "trunk.2.bias": [-0.0640680566, 0.323528737, 0.100577727, 0.183681175, -0.044098381],
    "heads.a.weight": [-0.222864687, 0.077387251, -0.404102325, -0.362355441, -0.271305144],
    "heads.a.bias": [0.254276425],
    "heads.b.weight": [
        0.26294902,
        -0.193519086,
        -0.0108240712,
        0.291317225,
        0.454228461,
        0.163615257,
        0.0628032982,
        0.304510713,
        -0.243335888,
        0.0957025886,
    ],
    "heads.b.bias": [-0.329649925, -0.260912031],
    "heads.c.weight": [-0.0456028841, 0.12685971, -0.134565309, 0.0131623307, 0.168498993],
    "heads.c.bias": [0.0921935961],
}


def test_warm_up_variant_matches_libmtl_main_reference_numbers():
    model = make_model()
    bal = SmoothTchebycheff(list(TASKS3), mu=0.5, preference={t: 1.0 for t in TASKS3}, warmup_steps=4, nadir_steps=2)
    history = train_ours(model, bal, 7)
    for name, p in model.named_parameters():
        expected = torch.tensor(STCH_MAIN_PARAMS_AFTER_7[name])
        torch.testing.assert_close(p.detach().flatten(), expected, rtol=1e-5, atol=1e-6, msg=name)
    assert bal.weighting.steps.item() == 7 and bal.weighting.nadir_sum.abs().sum() > 0
    assert sum(history[-1][f"weight/{t}"].item() for t in TASKS3) != pytest.approx(
        sum(history[0][f"weight/{t}"].item() for t in TASKS3)
    )


def test_warm_up_state_resumes_and_a_skipped_step_keeps_it():
    saved = assert_resume_and_skip_keep_the_state(
        lambda model: SmoothTchebycheff(list(TASKS3), mu=0.5, warmup_steps=2, nadir_steps=1), first=2, then=2
    )
    assert saved["weighting.steps"].item() == 2 and saved["weighting.nadir_sum"].abs().sum() > 0


def test_under_accumulation_the_warm_up_uses_the_steps_mean_losses():
    """The weights of each micro-batch are those of the step's mean so far, and the nadir point sums the whole step's
    losses (its micro-batches' mean weighted by their examples)."""
    from mtl_bench.balancers import BackwardContext

    bal = SmoothTchebycheff(["a", "b"], mu=0.5, warmup_steps=1)
    ctx = BackwardContext(factor=0.5, accumulation_steps=2)
    weights = []
    for values, items in (((1.0, 2.0), 3), ((5.0, 6.0), 1)):
        shared = torch.zeros(items, requires_grad=True)
        metrics = bal.backward({t: v + shared.mean() for t, v in zip("ab", values)}, shared, ctx)
        weights.append([metrics["weight/a"].item(), metrics["weight/b"].item()])
    bal.step(False)
    assert weights == [pytest.approx([1.0, 0.5]), pytest.approx([1 / 2.0, 1 / 3.0])]  # 1/L of the mean so far
    torch.testing.assert_close(bal.weighting.nadir_sum, torch.tensor([2.0, 3.0]))  # (3·1 + 5) / 4, (3·2 + 6) / 4
    assert bal.weighting.steps.item() == 1


def test_bad_warm_up_options():
    with pytest.raises(ValueError, match="^nadir_steps: only with warmup_steps > 0"):
        SmoothTchebycheff(list(TASKS3), nadir_steps=2)
    with pytest.raises(ValueError, match=r"^nadir_steps: must be an integer in \[1, 3\] \(at most warmup_steps\)"):
        SmoothTchebycheff(list(TASKS3), warmup_steps=3, nadir_steps=4)


def test_a_drawn_preference_gives_the_stch_weights_of_that_step():
    """w = λ ⊙ softmax(λ ⊙ (L − z) / μ) with the step's λ ~ Dir(1) (no warm-up); a new λ each step."""
    bal = SmoothTchebycheff(["a", "b", "c"], mu=0.5, preference="dirichlet", seed=4)
    losses = torch.tensor([3.0, 4.0, 1.0])
    seen = []
    for _ in range(3):
        shared = torch.zeros(1, requires_grad=True)
        metrics = bal.backward({t: (v + shared).sum() for t, v in zip("abc", losses.tolist())}, shared)
        bal.step(torch.tensor(False))
        r = torch.stack([metrics[f"preference/{t}"] for t in "abc"])
        expected = r * torch.softmax(r * losses / 0.5, 0)
        torch.testing.assert_close(torch.stack([metrics[f"weight/{t}"] for t in "abc"]), expected)
        seen.append(tuple(r.tolist()))
    assert len(set(seen)) == 3
    with pytest.raises(ValueError, match="warmup_steps: the warm-up's nadir point needs a fixed preference"):
        SmoothTchebycheff(["a", "b"], preference="dirichlet", warmup_steps=5)
