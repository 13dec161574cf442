"""EnCodec's constructor forms (a mapping of weights first, or `weights=` alone) for every balancer that takes weights
(each constructor's own `weights_first`); a dict where task names are expected elsewhere is a TypeError naming what
to pass."""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch

import mtl_bench.balancers as balancers
from mtl_bench.balancers import Balancer, FixedWeights

CLASSES = sorted(
    (c for c in vars(balancers).values() if inspect.isclass(c) and issubclass(c, Balancer)), key=lambda c: c.__name__
)


def test_every_exported_balancer_is_checked() -> None:
    assert len(CLASSES) >= 18 and Balancer in CLASSES


WEIGHTED = [c for c in CLASSES if "weights" in inspect.signature(c).parameters]
UNWEIGHTED = [c for c in CLASSES if c not in WEIGHTED]


def test_the_weighted_balancers_are_found() -> None:
    assert {c.__name__ for c in WEIGHTED} >= {"FixedWeights", "RescaledNormBalancer", "ScaleInvariant"}


@pytest.mark.parametrize("cls", UNWEIGHTED, ids=lambda c: c.__name__)
def test_a_dict_as_task_names_of_a_balancer_without_weights_is_a_type_error_naming_the_fix(
    cls: type[Balancer],
) -> None:
    fix = rf"pass {cls.__name__}\(\['a', 'b'\]\) \({cls.__name__} takes no per-task weights\)"
    with pytest.raises(TypeError, match=rf"^{cls.__name__}: the first argument is the task names .*; {fix}$"):
        cls({"a": 1, "b": 2})
    with pytest.raises(TypeError, match="the first argument is the task names"):
        cls(task_names={"a": 1, "b": 2})


@pytest.mark.parametrize("cls", WEIGHTED, ids=lambda c: c.__name__)
def test_encodecs_constructor_forms_take_the_task_names_from_the_weights(cls: type[Balancer]) -> None:
    """EnCodec's `Balancer(weights, ...)` and `Balancer(weights=...)`: the mapping's keys are the tasks, its values
    the weights; the same balancer as the explicit form."""
    weights = {"a": 1.0, "b": 3.0}
    explicit = cls(["a", "b"], weights=weights)
    for built in (cls(weights), cls(weights=weights), cls({"a": 1, "b": 3})):
        assert built.task_names == ["a", "b"]
        state, expected = built.state_dict(), explicit.state_dict()
        assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state)
        assert repr(built) == repr(explicit)
    with pytest.raises(TypeError, match="weights given twice"):
        cls(weights, weights=weights)


def test_encodecs_options_after_the_weights_go_by_name() -> None:
    """EnCodec's signature is (weights, rescale_grads, total_norm, ...): after the mapping, the options go by name;
    a positional one would land in `weights`, so it is a TypeError saying so."""
    bal = balancers.RescaledNormBalancer({"a": 1, "b": 1}, rescale_grads=False, total_norm=2.0)
    assert (bal.rescale_grads, bal.total_norm) == (False, 2.0)
    with pytest.raises(TypeError, match=r"^RescaledNormBalancer: after a weights mapping, pass the options by name"):
        balancers.RescaledNormBalancer({"a": 1, "b": 1}, False, 2.0)


def test_the_engines_build_with_task_names_and_weights_from_config_is_unchanged() -> None:
    from omegaconf import OmegaConf

    weights = OmegaConf.create({"b": 2.0, "a": 1.0})  # the task set's order wins over the mapping's
    bal = balancers.RescaledNormBalancer(task_names=["a", "b"], weights=weights)
    assert bal.task_names == ["a", "b"] and bal.weights.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"weights: no weight for tasks \['c'\]"):
        balancers.FixedWeights(task_names=["a", "b", "c"], weights=weights)


def test_task_names_as_a_list_still_build_copy_and_pickle() -> None:
    bal = FixedWeights(["a", "b"], weights={"a": 1.0, "b": 2.0})
    assert bal.task_names == ["a", "b"]
    for clone in (copy.deepcopy(bal), pickle.loads(pickle.dumps(bal))):
        assert clone.task_names == ["a", "b"]
        assert clone.weighting.weights.tolist() == [1.0, 2.0]


def test_every_balancer_keeps_its_constructors_signature():
    """The old-form check must not hide a constructor's options from the config check (inspect.signature)."""
    import inspect

    import mtl_bench.balancers as balancers

    for name in balancers.__all__:
        cls = getattr(balancers, name)
        if isinstance(cls, type) and issubclass(cls, balancers.Balancer) and cls is not balancers.Balancer:
            params = inspect.signature(cls).parameters
            assert "task_names" in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()), name


def test_scaled_grad_gives_the_bits_of_the_scaled_loss_without_the_product():
    import torch

    from mtl_bench.gradient_engine.staged import scaled_grad

    torch.manual_seed(0)
    x = torch.randn(5, 3, requires_grad=True)
    w = torch.randn(3, 2, requires_grad=True)
    loss = torch.tanh(x @ w).square().mean()
    for scale in (torch.tensor(1.0), torch.tensor(1 / 3), torch.tensor(65536.0), torch.tensor(float("nan"))):
        expected = torch.autograd.grad(loss * scale, [x, w], retain_graph=True)
        got = scaled_grad(loss, [x, w], scale, retain_graph=True)
        for e, g in zip(expected, got):
            assert torch.equal(e, g) or (e.isnan().all() and g.isnan().all())
    half = loss.half()  # another dtype: the product (autograd refuses a float32 gradient for an fp16 output)
    (expected,) = torch.autograd.grad(half * torch.tensor(3.0), [w], retain_graph=True)
    assert torch.equal(scaled_grad(half, [w], torch.tensor(3.0), retain_graph=True)[0], expected)
