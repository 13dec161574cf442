"""The front models against their reference code on tiny cases. The reference numbers were printed by the
references' own modules, run from these snapshots with the same weights (`fill`) and inputs (their code is not in
this repository):

- ruchtem/cosmos c198830d50575065f0dd31f8fcd5390b720bab98, multi_objective/methods/cosmos/cosmos.py `Upsampler`;
- AvivNavon/pareto-hypernetworks 6355fd28a05560806ba88ec898db4e6b46ba5ed9, experiments/multimnist/models.py
  `ResnetHyper` (its `layer_to_shape` set to the target's names and shapes below);
- nik-dim/pamal 26adf53c556ff70a1acd3377f0139901e362050d, src/ll/subspace_modules.py `SubspaceLinear`,
  `SubspaceConv`, `SubspaceBatchNorm2d` put in place of every Linear and Conv2d of our first member, their
  members being our members' layers (its `make_subspace_compatible`), `alpha` = the preference.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtl_bench.models import MLP, LeNet
from mtl_bench.models.fronts import COSMOS, PHN, PaMaL

HEADS = {"a": 2, "b": 1}


def fill(module: nn.Module, seed: float = 0.0) -> None:
    """Deterministic weights: sin(0.37 k + seed + 0.1 i) for the i-th parameter in name order, element k."""
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(module.named_parameters())):
            p.copy_(torch.sin(torch.arange(p.numel(), dtype=torch.float32) * 0.37 + seed + 0.1 * i).reshape(p.shape))


class Identity(MLP):
    """A 'model' that returns its input as the shared representation (to read what COSMOS feeds it)."""

    def forward(self, x, tasks=None):  # type: ignore[no-untyped-def,override]
        from mtl_bench.models import ModelOutput

        return ModelOutput(shared=x, preds={})


# Upsampler(3, child, [1, 3, 4]) on linspace(-1, 1, 24) as (2, 1, 3, 4), alpha (0.2, 0.3, 0.5): the three channels
# appended to the first sample, and the sum of those of the second.
COSMOS_IMAGE = [
    0.0, 0.0, 0.0, 0.0, 0.10722775757312775, 0.0, 0.0, 0.0, 0.30393150448799133, 0.49523258209228516, 0.0,
    0.14310885965824127, 0.0, 0.0, 0.0, 0.0, 0.1961350440979004, 0.11910060048103333, 0.0, 0.3534039556980133,
    0.5030257105827332, 0.771418571472168, 0.6356499791145325, 0.6643652319908142, 0.0, 0.0, 0.0, 0.0,
    0.17881888151168823, 0.22956815361976624, 0.6711972951889038, 0.804646909236908, 0.4296927750110626,
    0.629822850227356, 0.9274642467498779, 0.8258100152015686,
]  # fmt: skip
COSMOS_IMAGE_SECOND_SUM = 8.98962116241455


def test_cosmos_appends_the_upsampled_preference_as_the_reference_does() -> None:
    front = COSMOS(partial(Identity, widths=[1]), (1, 3, 4), HEADS)
    assert front.inner.trunk[1].in_features == (1 + 2) * 3 * 4  # built for the widened input
    with pytest.raises(ValueError, match="preference: expected 2 values"):
        front.set_preference(torch.tensor([0.2, 0.3, 0.5]))
    front = COSMOS(partial(Identity, widths=[1]), (1, 3, 4), {"a": 1, "b": 1, "c": 1})
    fill(front.upsampler)
    front.set_preference(torch.tensor([0.2, 0.3, 0.5]))
    x = torch.linspace(-1, 1, 24).reshape(2, 1, 3, 4)
    out = front(x).shared
    assert out.shape == (2, 4, 3, 4)
    assert torch.equal(out[:, :1], x)
    torch.testing.assert_close(out[0, 1:].flatten(), torch.tensor(COSMOS_IMAGE), rtol=1e-6, atol=1e-7)
    assert out[1, 1:].sum().item() == pytest.approx(COSMOS_IMAGE_SECOND_SUM, rel=1e-6)


def test_cosmos_appends_the_preference_to_vectors_as_the_reference_does() -> None:
    front = COSMOS(partial(Identity, widths=[1]), (5,), {"a": 1, "b": 1, "c": 1})
    front.set_preference(torch.tensor([0.2, 0.3, 0.5]))
    x = torch.linspace(-1, 1, 10).reshape(2, 5)
    expected = torch.cat((x, torch.tensor([[0.2, 0.3, 0.5]] * 2)), dim=1)  # the reference's output, exactly
    assert torch.equal(front(x).shared, expected)
    with pytest.raises(ValueError, match="input_shape: cosmos appends"):
        COSMOS(partial(Identity, widths=[1]), (3, 4), HEADS)


# ResnetHyper(preference_dim=2, preference_embedding_dim=3, hidden_dim=4, num_chunks=4, chunk_embedding_dim=2,
# num_ws=2, w_dim=5) at the preference (0.3, 0.7).
PHN_WEIGHTS = {
    "trunk.1.weight": [
        1.7109365463256836, 7.576220512390137, -0.33704042434692383, -7.63734245300293, -1.047938585281372,
        2.4463248252868652, 7.435720920562744, -1.0979094505310059, -7.634819984436035, -0.28661394119262695,
        1.3380589485168457, 9.825784683227539,
    ],
    "trunk.1.bias": [0.44378089904785156, -9.74531078338623, -2.211024761199951, 2.3042092323303223],
    "heads.a.weight": [
        9.731873512268066, -0.5394020080566406, -9.829691886901855, -1.2431449890136719, 1.2131357192993164,
        10.566987037658691, 0.7031149864196777, -10.439484596252441,
    ],
    "heads.a.bias": [-2.596242904663086, 2.255349636077881],
    "heads.b.weight": [10.488633155822754, -0.35330867767333984, -10.552705764770508, -1.5603532791137695],
    "heads.b.bias": [1.4015088081359863],
}  # fmt: skip


def test_phn_generates_the_reference_hypernetworks_weights_and_runs_the_target_on_them() -> None:
    front = PHN(
        partial(MLP, widths=[4]), (3,), HEADS, preference_embedding_dim=3, chunk_embedding_dim=2, hidden_dim=4,
        num_ws=2, w_dim=5,
    )  # fmt: skip
    hyper = front.hypernetwork
    assert hyper.num_chunks == 4  # ceil(31 generated numbers / (2 x 5))
    assert list(hyper.shapes) == list(PHN_WEIGHTS)
    fill(hyper)
    preference = torch.tensor([0.3, 0.7])
    weights = hyper(preference)
    for name, values in PHN_WEIGHTS.items():
        torch.testing.assert_close(weights[name].flatten(), torch.tensor(values), rtol=1e-5, atol=1e-5)
    # The target network runs on the generated weights; they are not its parameters any more.
    assert [n for n, _ in front.inner.named_parameters()] == []
    front.set_preference(preference)
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    hidden = F.relu(F.linear(x, weights["trunk.1.weight"], weights["trunk.1.bias"]))
    out = front(x)
    torch.testing.assert_close(out.preds["a"], F.linear(hidden, weights["heads.a.weight"], weights["heads.a.bias"]))
    torch.testing.assert_close(out.preds["b"], F.linear(hidden, weights["heads.b.weight"], weights["heads.b.bias"]))
    out.preds["a"].sum().backward()  # the loss reaches the hypernetwork
    assert all(p.grad is not None for p in hyper.fc.parameters())


def test_phn_generates_the_chosen_part_of_the_trunk_only() -> None:
    front = PHN(partial(MLP, widths=[4, 4]), (3,), HEADS, trunk_layers=1)
    assert list(front.hypernetwork.shapes) == [
        "trunk.3.weight", "trunk.3.bias", "heads.a.weight", "heads.a.bias", "heads.b.weight", "heads.b.bias",
    ]  # fmt: skip
    assert [n for n, _ in front.inner.named_parameters()] == ["trunk.1.weight", "trunk.1.bias"]
    with pytest.raises(ValueError, match=r"trunk_layers: must be null or 0\.\.2"):
        PHN(partial(MLP, widths=[4, 4]), (3,), HEADS, trunk_layers=3)


PAMAL_MLP = {"a": [3.9524059295654297, 0.4149986505508423, 3.2279915809631348, 2.920013189315796],
             "b": [3.8718323707580566, 3.674689292907715]}  # fmt: skip
PAMAL_LENET = {"a": [3.6966710090637207, 2.3317933082580566, 11.148273468017578, 8.397256851196289],
               "b": [3.7922191619873047, 11.705696105957031]}  # fmt: skip


@pytest.mark.parametrize(
    "factory, shape, expected",
    [
        (partial(MLP, widths=[4]), (3,), PAMAL_MLP),
        (partial(LeNet, channels=[2], hidden=3), (1, 4, 4), PAMAL_LENET),
    ],
)
def test_pamal_mixes_the_members_as_the_reference_subspace_layers_do(  # type: ignore[no-untyped-def]
    factory, shape, expected
) -> None:
    front = PaMaL(factory, shape, HEADS)
    assert len(front.members) == 2  # one per task
    for k, member in enumerate(front.members):
        fill(member, seed=float(k))
    front.set_preference(torch.tensor([0.3, 0.7]))
    n = 1
    for s in shape:
        n *= s
    x = torch.linspace(-1, 1, 2 * n).reshape(2, *shape)
    out = front(x)
    for task, values in expected.items():
        torch.testing.assert_close(out.preds[task].flatten(), torch.tensor(values), rtol=1e-6, atol=1e-6)
    # At a corner the model is that member.
    front.set_preference(torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(front(x).preds["a"], front.members[1](x).preds["a"])
    # Every member's parameters are trained.
    front.set_preference(torch.tensor([0.3, 0.7]))
    front(x).preds["a"].sum().backward()
    reached = [n for n, p in front.members[1].named_parameters() if p.grad is not None]
    assert reached == [n for n, _ in front.members[1].named_parameters() if not n.startswith("heads.b")]
