"""Task sets: the numbers their sources state (GradNorm sec. 4; load_digits images), losses and metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from mtl_bench.config import ENGINE_KEYS
from mtl_bench.engine.builders import build, node_dict
from mtl_bench.tasks import Digits, TaskSet, ToyRegression
from mtl_bench.tasks.digits import source_pools
from mtl_bench.tasks.losses import accuracy_metrics, mse_metrics
from mtl_bench.tasks.toy import toy_params

SMALL = dict(n_train=200, n_val=50, n_test=50)
PAPER_T10 = (48, 3, 54, 16, 9, 30, 52, 26, 47, 81)


# ----------------------------------------------------------------------------- toy


def test_toy_param_variances_match_the_paper():
    # N(0, 10) and N(0, 3.5) read as variances; 25,000 entries each: std error of a variance ~ v*sqrt(2/n) ~ 0.9 %.
    b, eps = toy_params(2, data_seed=0)
    assert b.shape == (100, 250) and eps.shape == (2, 100, 250)
    assert b.var().item() == pytest.approx(10.0, rel=0.04)
    assert eps[0].var().item() == pytest.approx(3.5, rel=0.04)
    assert eps[1].var().item() == pytest.approx(3.5, rel=0.04)
    assert abs(b.mean().item()) < 0.1 and abs(eps.mean().item()) < 0.05
    assert not torch.equal(eps[0], eps[1])  # each task has its own perturbation


def test_toy_targets_recomputed_from_the_formula():
    sigmas = (1.0, 100.0)
    ts = ToyRegression(sigmas, **SMALL, data_seed=3)
    b, eps = (p.double() for p in toy_params(2, data_seed=3))
    input_std = 1 / math.sqrt(250 * 13.5)
    for split in (ts.train, ts.test):
        x = split.inputs[:5].double() * input_std  # the model's inputs are x / input_std
        for i, sigma in enumerate(sigmas):
            expected = sigma * torch.tanh(x @ (b + eps[i]).T)  # f_i(x) = sigma_i tanh((B + eps_i) x)
            torch.testing.assert_close(split.targets[f"t{i}"][:5].double(), expected, rtol=1e-4, atol=1e-4 * sigma)


def test_toy_shapes_names_and_default_input_scale():
    ts = ToyRegression((1.0, 100.0), **SMALL)
    assert ts.task_names == ["t0", "t1"] and ts.input_shape == (250,)
    assert [len(ts.train), len(ts.val), len(ts.test)] == [200, 50, 50]
    assert ts.train.inputs.dtype == torch.float32 and ts.train.targets["t1"].shape == (200, 100)
    assert all(t.out_dim == 100 and t.higher_is_better == {"mse": False} for t in ts.tasks)
    # Default input_std = 1/sqrt(250 * 13.5): the pre-activations (B + eps_i) x have unit variance.
    b, eps = toy_params(2)
    x = ts.train.inputs / math.sqrt(250 * 13.5)  # undo the standardisation of the model's inputs
    pre = x @ (b + eps[0]).T
    assert ts.train.inputs.std().item() == pytest.approx(1.0, rel=0.03)
    assert pre.var().item() == pytest.approx(1.0, rel=0.1)
    # so tanh is not saturated: most |f_0| = |tanh(.)| are well below 1
    assert (ts.train.targets["t0"].abs() < 0.9).float().mean().item() > 0.7
    # with input_std=1 the targets saturate: almost every |f_0| is close to 1
    assert (ToyRegression((1.0,), **SMALL, input_std=1.0).train.targets["t0"].abs() > 0.9).float().mean().item() > 0.9


def test_toy_task_scale_is_proportional_to_sigma():
    # Only sigma differs between the tasks when eps is switched off: t1 / t0 is exactly 100.
    ts = ToyRegression((1.0, 100.0), **SMALL, eps_var=0.0)
    torch.testing.assert_close(ts.train.targets["t1"], 100.0 * ts.train.targets["t0"])
    # With eps on, the target scale still follows sigma (same tanh statistics, up to eps).
    ts = ToyRegression((1.0, 100.0), **SMALL)
    ratio = ts.train.targets["t1"].std() / ts.train.targets["t0"].std()
    assert ratio.item() == pytest.approx(100.0, rel=0.1)


def test_toy_splits_are_independent_draws():
    ts = ToyRegression((1.0, 100.0), **SMALL)
    assert not torch.equal(ts.train.inputs[:50], ts.val.inputs)
    assert not torch.equal(ts.val.inputs, ts.test.inputs)


def test_toy_is_deterministic_in_data_seed():
    a, b, c = (ToyRegression((1.0, 100.0), **SMALL, data_seed=s) for s in (0, 0, 1))
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(a, split).inputs, getattr(b, split).inputs)
        assert torch.equal(getattr(a, split).targets["t1"], getattr(b, split).targets["t1"])
    assert not torch.equal(a.train.inputs, c.train.inputs)
    assert not torch.equal(a.train.targets["t0"], c.train.targets["t0"])
    assert not torch.equal(toy_params(2, data_seed=0)[0], toy_params(2, data_seed=1)[0])


def test_toy_noise_changes_targets_only():
    clean = ToyRegression((1.0,), **SMALL)
    noisy = ToyRegression((1.0,), **SMALL, noise_std=0.5)
    assert torch.equal(clean.test.inputs, noisy.test.inputs)
    residual = noisy.train.targets["t0"] - clean.train.targets["t0"]
    assert residual.std().item() == pytest.approx(0.5, rel=0.05)


def test_toy_ten_task_preset_at_full_size():
    ts = ToyRegression(PAPER_T10)  # the preset's full size: 10k x 250 inputs, 10 tasks
    assert ts.task_names == [f"t{i}" for i in range(10)]
    assert ts.train.targets["t9"].shape == (10000, 100) and len(ts.val) == 1000 and len(ts.test) == 1000
    # |f_i| <= sigma_i, and over a million entries the largest come close to it.
    for i, sigma in enumerate(PAPER_T10):
        peak = ts.train.targets[f"t{i}"].abs().max().item()
        assert 0.9 * sigma < peak <= sigma


def test_toy_mse_loss_and_metric_by_hand():
    task = ToyRegression((1.0, 100.0), n_train=4, n_val=4, n_test=4, out_dim=2).tasks[0]
    pred = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    target = torch.tensor([[0.0, 1.0], [0.0, 2.0]])
    # per-sample MSE: (1 + 4)/2 = 2.5 and (0 + 4)/2 = 2; batch mean 2.25, batch sum 4.5.
    assert task.loss(pred, target).item() == pytest.approx(2.25)
    assert task.metrics(pred, target)["mse"].item() == pytest.approx(4.5)
    assert mse_metrics(pred, target)["mse"].item() == pytest.approx(4.5)


def test_toy_rejects_no_tasks():
    with pytest.raises(ValueError, match="^sigmas: "):
        ToyRegression(())


# ----------------------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target


@pytest.fixture(scope="module")
def digits() -> TaskSet:
    return Digits(**SMALL)


def _match(region: np.ndarray, images: np.ndarray, cols: slice) -> np.ndarray:
    """Indices of the source images whose columns `cols` equal `region` exactly."""
    return np.flatnonzero((images[:, :, cols] == region).all(axis=(1, 2)))


def test_digits_shapes_and_tasks(digits):
    assert digits.input_shape == (1, 8, 12) and digits.train.inputs.shape == (200, 1, 8, 12)
    assert digits.task_names == ["left", "right", "sum"]
    assert [t.out_dim for t in digits.tasks] == [10, 10, 1]
    assert {t.name: t.higher_is_better for t in digits.tasks} == {
        "left": {"accuracy": True},
        "right": {"accuracy": True},
        "sum": {"mse": False},
    }
    assert digits.train.targets["left"].dtype == torch.int64
    assert digits.train.targets["sum"].dtype == torch.float32 and digits.train.targets["sum"].shape == (200, 1)
    assert 0.0 <= digits.train.inputs.min() and digits.train.inputs.max() == 1.0  # 0..16 scaled to [0, 1]
    assert Digits(**SMALL, overlap=0).input_shape == (1, 8, 16)


def test_digits_pools_are_disjoint_and_cover_the_source():
    pools = source_pools(0)
    sets = {k: set(v.tolist()) for k, v in pools.items()}
    assert not (sets["train"] & sets["val"]) and not (sets["train"] & sets["test"]) and not (sets["val"] & sets["test"])
    assert sets["train"] | sets["val"] | sets["test"] == set(range(1797))
    assert len(sets["train"]) == round(0.7 * 1797) and len(sets["val"]) == round(0.15 * 1797)


def test_digits_without_overlap_are_real_images_from_their_own_pool(sklearn_digits):
    images, labels = sklearn_digits
    ts = Digits(**SMALL, overlap=0, data_seed=5)
    pools = {k: set(v.tolist()) for k, v in source_pools(5).items()}
    for split in ("train", "val", "test"):
        data = getattr(ts, split)
        for k in range(20):
            canvas = data.inputs[k, 0].numpy()
            for side, cols in (("left", slice(0, 8)), ("right", slice(8, 16))):
                found = _match(canvas[:, cols], images, slice(0, 8))
                assert len(found) == 1  # the 1797 images are distinct
                assert found[0] in pools[split]  # drawn from its own split's pool only
                assert labels[found[0]] == data.targets[side][k].item()
            assert data.targets["sum"][k, 0].item() == data.targets["left"][k].item() + data.targets["right"][k].item()


def test_digits_with_overlap_are_max_of_two_real_images(sklearn_digits, digits):
    images, labels = sklearn_digits
    pool = set(source_pools(0)["train"].tolist())
    for k in range(20):
        canvas = digits.train.inputs[k, 0].numpy()
        # Columns 0..3 show only the left image, columns 8..11 only the right one (overlap 4).
        lefts = [j for j in _match(canvas[:, :4], images, slice(0, 4)) if j in pool]
        rights = [j for j in _match(canvas[:, 8:], images, slice(4, 8)) if j in pool]
        composed = [
            (j, i)
            for j in lefts
            for i in rights
            if np.array_equal(
                np.concatenate(
                    [images[j][:, :4], np.maximum(images[j][:, 4:], images[i][:, :4]), images[i][:, 4:]], axis=1
                ),
                canvas,
            )
        ]
        assert composed, f"sample {k} is not max(left, right) of two train-pool images"
        assert any(
            labels[j] == digits.train.targets["left"][k] and labels[i] == digits.train.targets["right"][k]
            for j, i in composed
        )
    sums = digits.train.targets["left"] + digits.train.targets["right"]
    assert torch.equal(digits.train.targets["sum"][:, 0], sums.float())


def test_digits_is_deterministic_in_data_seed(digits):
    again, other = Digits(**SMALL), Digits(**SMALL, data_seed=1)
    assert torch.equal(digits.test.inputs, again.test.inputs)
    assert torch.equal(digits.test.targets["sum"], again.test.targets["sum"])
    assert not torch.equal(digits.train.inputs, other.train.inputs)
    assert not torch.equal(source_pools(0)["test"], source_pools(1)["test"])


def test_digits_metrics_and_losses_by_hand(digits):
    left, _, total = digits.tasks
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [5.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    metrics = left.metrics(logits, torch.tensor([0, 1, 2, 2]))
    assert list(metrics) == ["accuracy"] and metrics["accuracy"].item() == 3.0  # rows 0, 1, 3 right
    assert accuracy_metrics(logits, torch.tensor([1, 1, 1, 1]))["accuracy"].item() == 1.0
    # Uniform logits: cross-entropy log(10), the task's stated initial loss.
    assert left.loss(torch.zeros(7, 10), torch.arange(7)).item() == pytest.approx(math.log(10))
    assert left.initial_loss == pytest.approx(math.log(10))
    pred, target = torch.tensor([[3.0], [10.0], [7.5]]), torch.tensor([[4.0], [7.0], [7.5]])
    assert total.metrics(pred, target)["mse"].item() == pytest.approx(1.0 + 9.0 + 0.0)
    assert total.loss(pred, target).item() == pytest.approx(10.0 / 3)
    with pytest.raises(ValueError, match="shape"):
        total.loss(pred, target[:, 0])  # (N, 1) vs (N,) would broadcast to (N, N)


def test_digits_rejects_bad_overlap():
    with pytest.raises(ValueError, match=r"^overlap: must be 0\.\.8 columns, got 9$"):
        Digits(**SMALL, overlap=9)


@pytest.mark.parametrize("option, cls", [("toy", ToyRegression), ("toy10", ToyRegression), ("digits", Digits)])
def test_config_options_build_their_class(compose_cfg, option, cls):
    # The TASK_SETS registry is gone: each conf/tasks/<option>.yaml names its class by _target_.
    node = compose_cfg(f"tasks={option}", *(f"tasks.{k}={v}" for k, v in SMALL.items())).tasks
    built = build("tasks", node, TaskSet)
    assert type(built) is cls
    direct = cls(**{k: v for k, v in node_dict(node).items() if k not in ("_target_", *ENGINE_KEYS["tasks"])})
    assert built.task_names == direct.task_names and built.input_shape == direct.input_shape
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(built, split).inputs, getattr(direct, split).inputs)


def test_digits_standardized_sum_trains_in_standard_units_and_reports_squared_digits(digits):
    scaled = Digits(**SMALL, standardize_sum=True)
    raw, std = digits.train.targets["sum"], scaled.train.targets["sum"]
    assert torch.allclose(std, (raw - 9.0) / math.sqrt(16.5))  # the exact moments of a sum of two uniform digits
    assert torch.equal(scaled.train.inputs, digits.train.inputs)  # the same pairs
    sum_task = next(t for t in scaled.tasks if t.name == "sum")
    pred = std + 0.5  # off by 0.5 standard units: 0.5^2 * 16.5 squared digits per sample
    assert sum_task.loss(pred, std).item() == pytest.approx(0.25)
    assert sum_task.metrics(pred, std)["mse"].item() == pytest.approx(0.25 * 16.5 * len(std), rel=1e-5)
    # Var of the raw sum over the generated pairs is near 16.5 (uniform digits, drawn with replacement).
    assert raw.var().item() == pytest.approx(16.5, rel=0.2)
