"""tasks=nyuv2 and tasks=cityscapes on tiny trees in the real preprocessed format: items, splits, bad input
(one line naming tasks.root, the path and what was expected, before training), and 2 training steps through
the engine with every metric in metrics.json."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from mtl_bench.engine.builders import build
from mtl_bench.engine.compose import finalise_config
from mtl_bench.engine.evaluate import evaluate
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError
from mtl_bench.tasks import Cityscapes, NYUv2
from tests.helpers.dense_tree import TinyDense, write_cityscapes, write_nyuv2
from tests.tasks.test_dense_metrics import reference_test_loop

NYU_METRICS = {
    "segmentation": ["loss", "miou", "pixel_acc"],
    "depth": ["loss", "abs_err", "rel_err"],
    "normal": ["loss", "angle_mean", "angle_median", "within_11_25", "within_22_5", "within_30"],
}


@pytest.fixture(scope="module")
def nyu_root(tmp_path_factory):
    return write_nyuv2(tmp_path_factory.mktemp("nyuv2"), n_train=4, n_val=3)


@pytest.fixture(scope="module")
def city_root(tmp_path_factory):
    return write_cityscapes(tmp_path_factory.mktemp("cityscapes"), n_train=4, n_val=3)


def test_nyuv2_items_are_the_files_in_the_documented_format(nyu_root):
    tasks = NYUv2(str(nyu_root), augment=False)
    assert tasks.task_names == ["segmentation", "depth", "normal"] and tasks.input_shape == (3, 288, 384)
    assert [t.out_dim for t in tasks.tasks] == [13, 1, 3]
    assert (len(tasks.train), len(tasks.val), len(tasks.test)) == (4, 3, 3) and tasks.val is tasks.test
    image, targets = tasks.test[2]
    assert image.shape == (3, 288, 384) and image.dtype == torch.float32
    assert targets["segmentation"].shape == (288, 384) and targets["segmentation"].dtype == torch.int64
    assert targets["depth"].shape == (1, 288, 384) and targets["normal"].shape == (3, 288, 384)
    files = {kind: np.load(nyu_root / "val" / kind / "2.npy") for kind in ("image", "label", "depth", "normal")}
    assert torch.equal(image, torch.from_numpy(np.moveaxis(files["image"], -1, 0)))
    assert torch.equal(targets["segmentation"], torch.from_numpy(files["label"]).long())
    assert targets["segmentation"].min() == -1  # ignored pixels stay -1
    assert torch.equal(targets["depth"], torch.from_numpy(np.moveaxis(files["depth"], -1, 0)))
    assert torch.equal(targets["normal"], torch.from_numpy(np.moveaxis(files["normal"], -1, 0)))


def test_cityscapes_items_and_float64_files(tmp_path, city_root):
    tasks = Cityscapes(str(city_root))
    assert tasks.task_names == ["segmentation", "depth"] and tasks.input_shape == (3, 128, 256)
    image, targets = tasks.train[0]  # augmented: same shapes and dtypes
    assert image.shape == (3, 128, 256) and set(targets) == {"segmentation", "depth"}
    assert targets["segmentation"].dtype == torch.int64 and int(targets["segmentation"].max()) < 7
    wide = write_cityscapes(tmp_path / "f64", n_train=2, n_val=1, dtype=np.float64)  # any float width is read
    image, targets = Cityscapes(str(wide)).test[0]
    assert image.dtype == targets["depth"].dtype == torch.float32


def test_training_items_are_augmented_and_test_items_are_not(nyu_root):
    tasks = NYUv2(str(nyu_root))
    torch.manual_seed(0)
    changed = sum(not torch.equal(tasks.train[i][0], NYUv2(str(nyu_root), augment=False).train[i][0]) for i in range(4))
    assert changed >= 1  # scale 1 and no flip (1/6 per item) leave one unchanged
    assert tasks.test.augment is False


def test_val_fraction_holds_out_part_of_train(nyu_root):
    tasks = NYUv2(str(nyu_root), val_fraction=0.25, split_seed=3)
    assert len(tasks.train) == 3 and len(tasks.val) == 1 and len(tasks.test) == 3
    assert not set(tasks.train.indices) & set(tasks.val.indices) and tasks.val.augment is False
    assert tasks.val.indices == NYUv2(str(nyu_root), val_fraction=0.25, split_seed=3).val.indices


def test_evaluation_equals_the_reference_test_loop(nyu_root):
    """The engine's evaluate on the tree = Nash-MTL's test loop (batch 2) on the same model's predictions."""
    torch.manual_seed(0)
    tasks = NYUv2(str(nyu_root))
    model = TinyDense(tasks.input_shape, {t.name: t.out_dim for t in tasks.tasks})
    got = evaluate(model, tasks.tasks, tasks.test, torch.device("cpu"))
    with torch.no_grad():
        items = [tasks.test[i] for i in range(len(tasks.test))]
        preds = model(torch.stack([x for x, _ in items])).preds
    targets = {name: torch.stack([y[name] for _, y in items]) for name in tasks.task_names}
    expected = reference_test_loop(preds, targets, batch=2, num_classes=13)
    for task, names in NYU_METRICS.items():
        for name in names[1:]:
            assert got[task][name] == pytest.approx(expected[name], rel=1e-5), (task, name)


# ----------------------------------------------------------------------------------------------- bad input


def bad(message: str, tasks=NYUv2, **kwargs):
    with pytest.raises(ValueError, match=message) as info:
        tasks(**kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_root_missing_or_not_there(tmp_path):
    bad(
        r"^root: not set: give the folder that holds train/ and val/, e.g. tasks.root=/data/nyuv2; expected the "
        r"NYUv2 layout \{train,val\}/\{image,label,depth,normal\}/<i>.npy at 288x384"
    )
    bad(rf"^root: {tmp_path}/nowhere does not exist; expected the NYUv2 layout", root=str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("")
    bad(r"^root: .*/file is not a directory", root=str(tmp_path / "file"))


def test_a_tree_of_the_other_layout_is_named(nyu_root, city_root):
    bad(
        rf"^root: {city_root}/train has no label, normal folder \(it has: depth, image, label_7\) \(a Cityscapes "
        r"tree\? that is tasks=cityscapes\); expected the NYUv2 layout",
        root=str(city_root),
    )
    bad(
        rf"^root: {nyu_root}/train has no label_7 folder .*\(an NYUv2 tree\? that is tasks=nyuv2\); expected the "
        r"Cityscapes layout \{train,val\}/\{image,label_7,depth\}/<i>.npy at 128x256",
        Cityscapes,
        root=str(nyu_root),
    )


@pytest.mark.parametrize(
    ("kind", "array", "message"),
    [
        (
            "image",
            np.zeros((128, 256, 3), np.float32),
            r"image/1.npy has shape \(128, 256, 3\) dtype float32, not shape "
            r"\(288, 384, 3\) dtype float",
        ),
        (
            "image",
            np.zeros((288, 384, 3), np.uint8),
            r"image/1.npy has shape \(288, 384, 3\) dtype uint8, not shape "
            r"\(288, 384, 3\) dtype float",
        ),
        (
            "depth",
            np.zeros((288, 384), np.float32),
            r"depth/1.npy has shape \(288, 384\) dtype float32, not shape "
            r"\(288, 384, 1\) dtype float",
        ),
        (
            "normal",
            np.zeros((3, 288, 384), np.float32),
            r"normal/1.npy has shape \(3, 288, 384\) dtype float32, not "
            r"shape \(288, 384, 3\) dtype float",
        ),
        (
            "label",
            np.zeros((288, 384), np.bool_),
            r"label/1.npy has shape \(288, 384\) dtype bool, not shape \(288, 384\) "
            r"dtype float or signed int",
        ),
    ],
)
def test_a_file_of_the_wrong_shape_or_dtype(tmp_path, kind, array, message):
    root = write_nyuv2(tmp_path, n_train=2, n_val=2)
    np.save(root / "val" / kind / "1.npy", array)
    bad(rf"^root: {root}/val/{message}; expected the NYUv2 layout", root=str(root))


def test_missing_files_empty_splits_and_bad_labels(tmp_path):
    root = write_nyuv2(tmp_path / "a", n_train=3, n_val=1)
    (root / "train" / "depth" / "2.npy").unlink()
    bad(rf"^root: {root}/train/depth holds 2 .npy files but {root}/train/image holds 3", root=str(root))
    (root / "train" / "depth" / "2.npy").write_bytes(b"not numpy")
    bad(rf"^root: {root}/train/depth/2.npy is not a .npy file \(no NumPy header\)", root=str(root))
    np.save(root / "train" / "depth" / "2.npy", np.ones((288, 384, 1), np.float32))
    with open(root / "train" / "depth" / "2.npy", "r+b") as file:
        file.truncate(1000)
    bad(rf"^root: {root}/train/depth/2.npy is not a readable .npy file \(", root=str(root))
    np.save(root / "train" / "depth" / "2.npy", np.ones((288, 384, 1), np.float32))
    (root / "train" / "normal" / "2.npy").rename(root / "train" / "normal" / "7.npy")
    bad(rf"^root: {root}/train/normal holds 3 .npy files that are not 0.npy..2.npy \(e.g. 7.npy\)", root=str(root))
    empty = write_nyuv2(tmp_path / "b", n_train=1, n_val=1)
    for path in (empty / "val" / "image").iterdir():
        path.unlink()
    bad(rf"^root: {empty}/val/image holds no .npy files; expected the NYUv2 layout", root=str(empty))
    labels = write_nyuv2(tmp_path / "c", n_train=1, n_val=1)
    np.save(labels / "train" / "label" / "0.npy", np.full((288, 384), 13.0, np.float32))
    bad(
        rf"^root: {labels}/train/label/0.npy holds label values \[13.0\], not class indices 0..12 or -1",
        root=str(labels),
    )


def test_bad_options_name_their_key(nyu_root):
    bad(r"^val_fraction: must be in \[0, 1\), got 1.0", root=str(nyu_root), val_fraction=1.0)
    bad(r"^val_fraction: 0.01 of 4 training images leaves 0 for val", root=str(nyu_root), val_fraction=0.01)
    bad(r"^error_batch: must be a number of images >= 1", root=str(nyu_root), error_batch=0)


def test_the_config_error_is_one_line_naming_tasks_root(compose_cfg, tmp_path):
    cfg = compose_cfg("tasks=cityscapes", f"tasks.root={tmp_path / 'nowhere'}")
    with pytest.raises(ConfigError, match=rf"^tasks.root: {tmp_path}/nowhere does not exist; expected the Cityscapes"):
        build("tasks", cfg.tasks)


# ----------------------------------------------------------------------------------------------- training


def short_run(compose_cfg, *overrides: str):
    overrides = (
        "model._target_=tests.helpers.dense_tree.TinyDense",
        "trainer=smoke",
        "trainer.max_steps=2",
        "trainer.batch_size=2",
        "trainer.log_every=1",
        "trainer.eval_every=2",
        "trainer.device=cpu",
        *overrides,
    )
    cfg = compose_cfg(*overrides)
    finalise_config(cfg, list(overrides))  # as train() does: drops the mlp option's keys that TinyDense does not take
    return cfg


@pytest.mark.parametrize("workers", [0, 2])
def test_nyuv2_trains_two_steps_with_every_metric(compose_cfg, tmp_path, nyu_root, workers):
    cfg = short_run(compose_cfg, "tasks=nyuv2", f"tasks.root={nyu_root}", f"trainer.num_workers={workers}")
    result = train(cfg, tmp_path)
    assert result.step == 2
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "completed"
    for split in ("val", "test"):
        assert {task: sorted(values) for task, values in metrics[split].items()} == {
            task: sorted(names) for task, names in NYU_METRICS.items()
        }
        assert all(math.isfinite(v) for values in metrics[split].values() for v in values.values())
    assert metrics["reference"]["normal"]["angle_median"] == 19.21
    assert metrics["higher_is_better"]["normal"]["within_30"] is True
    assert metrics["higher_is_better"]["depth"]["abs_err"] is False


def test_augmented_draws_are_the_same_with_loader_workers_and_across_a_resume(compose_cfg, tmp_path, nyu_root):
    """MTAN's random crop and flip are seeded by each draw's key (engine/data.py SampleIndex), not by whichever
    process loads the sample: 4 steps in one process equal 2 steps with 2 workers resumed for 2 more."""
    common = ("tasks=nyuv2", f"tasks.root={nyu_root}", "tasks.augment=true", "trainer.checkpoint_every=2")
    train(short_run(compose_cfg, *common, "trainer.max_steps=4"), tmp_path / "whole")
    for steps in (2, 4):
        train(
            short_run(
                compose_cfg, *common, f"trainer.max_steps={steps}", "trainer.num_workers=2", "trainer.resume=auto"
            ),
            tmp_path / "resumed",
        )
    whole, resumed = (
        torch.load(tmp_path / run / "checkpoints" / "last.pt", weights_only=True)["model"]
        for run in ("whole", "resumed")
    )
    for name, value in whole.items():
        assert torch.equal(value, resumed[name]), name


def test_cityscapes_trains_two_steps(compose_cfg, tmp_path, city_root):
    cfg = short_run(compose_cfg, "tasks=cityscapes", f"tasks.root={city_root}", "tasks.error_batch=null")
    train(cfg, tmp_path)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert sorted(metrics["test"]) == ["depth", "segmentation"]
    assert sorted(metrics["test"]["depth"]) == ["abs_err", "loss", "rel_err"]
    assert metrics["reference"] == {
        "segmentation": {"miou": 0.7401, "pixel_acc": 0.9316},
        "depth": {"abs_err": 0.0125, "rel_err": 27.77},
    }


def test_nyuv2_trains_with_segnet(compose_cfg, tmp_path, nyu_root):
    """The model of these task sets (narrow filters: the test is about the plumbing, not the model's size)."""
    overrides = [
        "tasks=nyuv2",
        f"tasks.root={nyu_root}",
        "model=segnet",
        "model.filters=[4,4,4,4,4]",
        "trainer=smoke",
        "trainer.max_steps=2",
        "trainer.batch_size=2",
        "trainer.eval_every=2",
        "trainer.device=cpu",
    ]
    train(compose_cfg(*overrides), tmp_path, overrides=overrides)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert all(math.isfinite(v) for values in metrics["test"].values() for v in values.values())


def test_shipped_reference_presets_name_only_real_metrics(compose_cfg):
    for option, expected in (
        ("nyuv2", NYU_METRICS),
        ("cityscapes", {k: NYU_METRICS[k] for k in ("segmentation", "depth")}),
    ):
        reference = OmegaConf.to_container(compose_cfg(f"tasks={option}").tasks.reference)
        assert {task: sorted(values) for task, values in reference.items()} == {
            task: sorted(names[1:]) for task, names in expected.items()
        }
