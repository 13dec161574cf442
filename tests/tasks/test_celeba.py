"""tasks=celeba, model=celeba_cnn and experiment=celeba_cnn on tiny trees in the real CelebA format: items and splits
against FAMO's own reader, the loss and metrics against hand-computed cases and FAMO's own code, bad input (one
line naming tasks.root, the path and what was expected, before training), FAMO's CNN, and 2 training steps.

Test oracles, copied verbatim (only reformatted) from Cranial-XIX/FAMO @ 0a6ad06dbdd55fce73ec01e3a175c2498cd1e5e9,
used here and nowhere else: experiments/celeba/data.py (CelebaDataset) and experiments/celeba/trainer.py
(CelebaMetrics).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from mtl_bench.engine.builders import build
from mtl_bench.engine.evaluate import evaluate
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError
from mtl_bench.models.celeba_cnn import CelebACNN
from mtl_bench.settings import to_steps
from mtl_bench.tasks.celeba import ATTRIBUTES, CelebA, attribute_loss, attribute_task
from tests.helpers.celeba_tree import write_celeba

# ----------------------------------------------------------------------------------------------- oracles


class CelebaDataset:  # FAMO experiments/celeba/data.py (VisionDataset base dropped: it only stores root)
    """Custom Dataset for loading CelebA face images"""

    def __init__(self, data_dir, split="train", image_size=(64, 64)):
        from torchvision import transforms

        rep_file = os.path.join(data_dir, "Eval/list_eval_partition.txt")
        self.img_dir = os.path.join(data_dir, "Img/img_align_celeba/")
        self.ann_file = os.path.join(data_dir, "Anno/list_attr_celeba.txt")
        self.image_size = image_size

        with open(rep_file) as f:
            rep = f.read()
        rep = [elt.split() for elt in rep.split("\n")]
        rep.pop()

        with open(self.ann_file, "r") as f:
            data = f.read()
        data = data.split("\n")
        data = [elt.split() for elt in data[2:]]
        data.pop()

        self.img_names = []
        self.labels = []
        for k in range(len(data)):
            assert data[k][0] == rep[k][0]
            if (
                (split == "train" and int(rep[k][1]) == 0)
                or (split == "val" and int(rep[k][1]) == 1)
                or (split == "test" and int(rep[k][1]) == 2)
            ):
                self.img_names.append(data[k][0])
                self.labels.append([1 if elt == "1" else 0 for elt in data[k][1:]])

        target_size = image_size
        self.transform = [transforms.Resize(target_size), transforms.ToTensor()]
        self.transform = transforms.Compose(self.transform)
        self.labels_rep = [[i] for i in range(40)]

    def __getitem__(self, index):
        from PIL import Image

        img = Image.open(os.path.join(self.img_dir, self.img_names[index])).convert("RGB")
        if self.transform is not None:
            img = self.transform(img)

        labels = [
            torch.tensor(self.labels[index], dtype=torch.float32)[self.labels_rep[task]]
            for task in range(len(self.labels_rep))
        ]
        return img, labels

    def __len__(self):
        return len(self.img_names)


class CelebaMetrics:  # FAMO experiments/celeba/trainer.py
    """
    CelebA metric accumulator.
    """

    def __init__(self):
        self.reset()

    def reset(self):
        self.tp = 0.0
        self.fp = 0.0
        self.fn = 0.0

    def incr(self, y_preds, ys):
        # y_preds: [ y_pred (batch, 1) ] x 40
        # ys     : [ y_pred (batch, 1) ] x 40
        y_preds = torch.stack(y_preds).detach()  # (40, batch, 1)
        ys = torch.stack(ys).detach()  # (40, batch, 1)
        y_preds = y_preds.gt(0.5).float()
        self.tp += (y_preds * ys).sum([1, 2])  # (40,)
        self.fp += (y_preds * (1 - ys)).sum([1, 2])
        self.fn += ((1 - y_preds) * ys).sum([1, 2])

    def result(self):
        precision = self.tp / (self.tp + self.fp + 1e-8)
        recall = self.tp / (self.tp + self.fn + 1e-8)
        f1 = 2 * precision * recall / (precision + recall + 1e-8)
        return f1.cpu().numpy()


# ----------------------------------------------------------------------------------------------- trees


@pytest.fixture(scope="module")
def original_root(tmp_path_factory):
    """The original release's layout (FAMO reads it), 9 images: 4 train, 2 val, 3 test, in mixed order."""
    return write_celeba(
        tmp_path_factory.mktemp("celeba"), n=9, seed=1, layout="original", partition=[0, 2, 0, 1, 0, 2, 1, 0, 2]
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_celeba(tmp_path_factory.mktemp("celeba_flat"), n=6, seed=0)


def test_splits_labels_and_images_equal_famos_reader(original_root):
    tasks = CelebA(str(original_root), metrics=["accuracy", "error", "f1"])
    assert tasks.task_names == list(ATTRIBUTES) and tasks.input_shape == (3, 64, 64)
    assert all(t.out_dim == 1 for t in tasks.tasks)
    for split in ("train", "val", "test"):
        ours, famo = getattr(tasks, split), CelebaDataset(str(original_root), split=split)
        assert ours.names == famo.img_names and len(ours) == len(famo) == {"train": 4, "val": 2, "test": 3}[split]
        for i in range(len(famo)):
            image, targets = ours[i]
            famo_image, famo_labels = famo[i]
            assert image.shape == (3, 64, 64) and image.dtype == torch.float32
            assert 0 <= float(image.min()) and float(image.max()) <= 1
            assert torch.equal(image, famo_image)  # FAMO's PIL decode, Resize((64, 64)) and ToTensor, exactly
            assert [targets[name] for name in ATTRIBUTES] == famo_labels
            assert all(t.shape == (1,) and t.dtype == torch.float32 for t in targets.values())


def test_torchvision_layouts_and_line_endings(tmp_path):
    """The folder holding the files, its parent with celeba/ (torchvision's root), and CRLF lines: the same items."""
    folder = write_celeba(tmp_path / "tv", n=4, seed=3, layout="torchvision", newline="\r\n")
    assert folder == tmp_path / "tv" / "celeba"
    parent, direct = CelebA(str(tmp_path / "tv")), CelebA(str(folder))
    assert parent.test.names == direct.test.names == ["000004.jpg"]
    x, y = parent.train[1]
    x2, y2 = direct.train[1]
    assert torch.equal(x, x2) and y == y2
    lines = (folder / "list_attr_celeba.txt").read_bytes().decode().split("\r\n")
    values = lines[3].split()[1:]  # 000002.jpg's row
    assert [y[name].item() for name in ATTRIBUTES] == [1.0 if v == "1" else 0.0 for v in values]


def test_attributes_image_size_and_metrics_options(root):
    tasks = CelebA(str(root), attributes=["Smiling", "Male"], image_size=[32, 48], metrics=["f1"])
    assert tasks.task_names == ["Smiling", "Male"] and tasks.input_shape == (3, 32, 48)
    image, targets = tasks.val[0]
    assert image.shape == (3, 32, 48) and set(targets) == {"Smiling", "Male"}
    everything = CelebA(str(root)).val[0][1]
    assert targets["Male"] == everything["Male"] and targets["Smiling"] == everything["Smiling"]
    assert tasks.tasks[0].higher_is_better == {"f1": True}
    assert CelebA(str(root)).tasks[0].higher_is_better == {"accuracy": True, "error": False}


# ----------------------------------------------------------------------------------------------- loss, metrics


def summary(task, pred, target):
    return {k: float(v) for k, v in task.summarize(task.metrics(pred, target), len(pred)).items()}


def test_metrics_on_a_hand_computed_case():
    task = attribute_task("Smiling", ["accuracy", "error", "f1"])
    logits = torch.tensor([[2.0], [-1.0], [0.5], [-3.0], [1.0]])
    target = torch.tensor([[1.0], [1.0], [0.0], [0.0], [1.0]])
    # predicted positive: 1 0 1 0 1 -> right, wrong, wrong, right, right; TP 2, FP 1, FN 1
    got = summary(task, logits, target)
    assert got["accuracy"] == pytest.approx(3 / 5) and got["error"] == pytest.approx(2 / 5)
    assert got["f1"] == pytest.approx(2 / 3, abs=1e-7)
    # no positive anywhere: FAMO's epsilons give f1 = 0, not NaN
    assert summary(task, -logits.abs(), torch.zeros(5, 1))["f1"] == 0.0
    assert summary(task, -logits.abs(), torch.zeros(5, 1))["accuracy"] == 1.0


def test_loss_equals_famos_bce_on_the_sigmoid():
    torch.manual_seed(0)
    logits, target = torch.randn(16, 1) * 3, torch.randint(0, 2, (16, 1)).float()
    expected = nn.BCELoss()(torch.sigmoid(logits), target)  # FAMO trainer.py: loss_fn = torch.nn.BCELoss()
    assert attribute_loss(logits, target).item() == pytest.approx(expected.item(), rel=1e-5)
    hand = -(target * logits.sigmoid().log() + (1 - target) * (1 - logits.sigmoid()).log()).mean()
    assert attribute_loss(logits, target).item() == pytest.approx(hand.item(), rel=1e-5)
    assert attribute_task("Male", ["error"]).initial_loss == pytest.approx(math.log(2))
    with pytest.raises(ValueError, match=r"expected \(N, 1\) logits"):
        attribute_loss(logits[:, 0], target[:, 0])


def test_f1_equals_famos_celeba_metrics_over_batches():
    """Two batches of 40 attributes: our sums over the batches, summarized, = FAMO's accumulator on sigmoids."""
    torch.manual_seed(1)
    tasks = [attribute_task(name, ["f1"]) for name in ATTRIBUTES]
    famo = CelebaMetrics()
    sums = [{} for _ in tasks]
    for batch in (7, 5):
        logits = [torch.randn(batch, 1) * 2 for _ in tasks]
        targets = [torch.randint(0, 2, (batch, 1)).float() for _ in tasks]
        famo.incr([torch.sigmoid(x) for x in logits], targets)
        for k, task in enumerate(tasks):
            for name, value in task.metrics(logits[k], targets[k]).items():
                sums[k][name] = sums[k].get(name, 0.0) + value
    ours = [float(task.summarize(s, 12)["f1"]) for task, s in zip(tasks, sums)]
    assert ours == pytest.approx(famo.result().tolist(), abs=1e-6)


def test_evaluation_of_the_tree_equals_famos_test_loop(original_root):
    """The engine's evaluate (batches of 2) = FAMO's loop over its loader (batch 3) on the same model's outputs."""
    torch.manual_seed(0)
    tasks = CelebA(str(original_root), metrics=["accuracy", "f1"])
    model = CelebACNN(tasks.input_shape, {t.name: 1 for t in tasks.tasks}, channels=[4, 4, 4, 4], hidden=8).eval()
    got = evaluate(model, tasks.tasks, tasks.test, torch.device("cpu"), batch_size=2)
    famo_set = CelebaDataset(str(original_root), split="test")
    famo, loss_sum, correct = CelebaMetrics(), 0.0, torch.zeros(40)
    loader = torch.utils.data.DataLoader(famo_set, batch_size=3, shuffle=False)
    with torch.no_grad():
        for x, y in loader:
            outputs = model(x).preds
            y_ = [torch.sigmoid(outputs[name]) for name in ATTRIBUTES]  # FAMO's Network ends in a sigmoid
            famo.incr(y_, y)
            loss_sum += nn.BCELoss()(y_[0], y[0]).item() * len(x)
            correct += torch.stack([(p.gt(0.5).float() == t).float().sum() for p, t in zip(y_, y)])
    f1 = famo.result()
    for k, name in enumerate(ATTRIBUTES):
        assert got[name]["f1"] == pytest.approx(float(f1[k]), abs=1e-6), name
        assert got[name]["accuracy"] == pytest.approx(float(correct[k]) / 3), name
    assert got[ATTRIBUTES[0]]["loss"] == pytest.approx(loss_sum / 3, rel=1e-3)


# ----------------------------------------------------------------------------------------------- bad input


def bad(message: str, **kwargs):
    with pytest.raises(ValueError, match=message) as info:
        CelebA(**kwargs)
    assert "\n" not in str(info.value)
    assert str(info.value).endswith(
        "expected torchvision's CelebA layout: img_align_celeba/ (178x218 JPEGs), "
        "list_attr_celeba.txt and list_eval_partition.txt in tasks.root or in "
        "tasks.root/celeba (or the original release's Img/, Anno/, Eval/ folders)"
    ) or message.startswith(("^image_size", "^attributes", "^metrics"))
    return str(info.value)


def test_root_missing_not_set_or_a_file(tmp_path):
    bad(r"^root: not set: give the folder that holds img_align_celeba/")
    bad(
        rf"^root: {tmp_path}/nowhere does not exist; expected torchvision's CelebA layout",
        root=str(tmp_path / "nowhere"),
    )
    (tmp_path / "file").write_text("")
    bad(rf"^root: {tmp_path}/file is not a directory", root=str(tmp_path / "file"))


def test_an_nyuv2_tree_or_a_partial_tree_is_named(tmp_path):
    from tests.helpers.dense_tree import write_nyuv2

    nyu = write_nyuv2(tmp_path / "nyu", n_train=1, n_val=1)
    bad(
        rf"^root: {nyu} has no img_align_celeba/, list_attr_celeba.txt, list_eval_partition.txt \(it has: train/, "
        r"val/\) \(an NYUv2 or Cityscapes tree\? that is tasks=nyuv2 or tasks=cityscapes\); expected",
        root=str(nyu),
    )
    partial = write_celeba(tmp_path / "orig", n=3, layout="original")
    (partial / "Eval" / "list_eval_partition.txt").unlink()
    bad(rf"^root: {partial} has no Eval/list_eval_partition.txt \(it has: Anno/, Eval/, Img/\)", root=str(partial))


def test_text_files_of_the_wrong_shape(tmp_path):
    folder = write_celeba(tmp_path, n=4)
    attr, part = folder / "list_attr_celeba.txt", folder / "list_eval_partition.txt"
    good = attr.read_text()
    lines = good.splitlines()
    attr.write_text("\n".join([lines[0], " ".join(ATTRIBUTES[:39]), *lines[2:]]) + "\n")
    bad(
        rf"^root: {attr} line 2 names 39 attributes \(5_o_Clock_Shadow Arched_Eyebrows Attractive \.\.\.\), not "
        r"CelebA's 40 \(5_o_Clock_Shadow \.\.\. Young\)",
        root=str(folder),
    )
    attr.write_text("\n".join([lines[0], lines[1], lines[2], lines[3][:-3], *lines[4:]]) + "\n")
    bad(rf"^root: {attr} row 2 \(000002.jpg\) has 39 values", root=str(folder))
    attr.write_text("\n".join([lines[0], lines[1], lines[2].replace("-1", " 0", 1), *lines[3:]]) + "\n")
    bad(rf"^root: {attr} row 1 \(000001.jpg\) has 40 values -1 0 1, not 40 values of -1 or 1", root=str(folder))
    attr.write_text("\n".join(["5", *lines[1:]]) + "\n")
    bad(rf"^root: {attr} line 1 says 5 images but 4 rows follow", root=str(folder))
    attr.write_text("\n".join(lines[1:]) + "\n")
    bad(rf"^root: {attr} line 1 is '5_o_Clock_Shadow Arched_Eyebrows", root=str(folder))
    attr.write_bytes(b"\xff\xfe" + good.encode())
    bad(rf"^root: {attr} is not a text file", root=str(folder))
    attr.write_text(good)
    part.write_text("000001.jpg 0\n000002.jpg 3\n000003.jpg 1\n000004.jpg 2\n")
    bad(rf"^root: {part} row 2 is '000002.jpg 3', not '<name>.jpg <0\|1\|2>'", root=str(folder))
    part.write_text("000001.jpg 0\n000002.jpg 0\n000003.jpg 1\n")
    bad(rf"^root: {part} lists 3 images, {attr} 4 \(000004.jpg is in list_attr_celeba.txt only\)", root=str(folder))


def test_a_split_with_no_images(tmp_path):
    folder = write_celeba(tmp_path, n=3, partition=[0, 0, 1])
    bad(
        rf"^root: {folder}/list_eval_partition.txt puts no image in the test split \(partition 2\); expected",
        root=str(folder),
    )


def test_missing_unreadable_or_wrong_size_images(tmp_path):
    from PIL import Image

    folder = write_celeba(tmp_path, n=6)
    images = folder / "img_align_celeba"
    (images / "000005.jpg").unlink()
    bad(
        rf"^root: {images} lacks 1 of the 6 images listed in {folder}/list_attr_celeba.txt \(e.g. 000005.jpg\)",
        root=str(folder),
    )
    (images / "000005.jpg").write_bytes(b"not a jpeg")  # 000005.jpg is the first test image: read in full
    bad(rf"^root: {images}/000005.jpg is not a readable image \(", root=str(folder))
    Image.new("RGB", (64, 64)).save(images / "000005.jpg", format="JPEG")
    bad(rf"^root: {images}/000005.jpg is 64x64 \(RGB\), not 178x218; expected", root=str(folder))
    (images / "000005.jpg").write_bytes((images / "000001.jpg").read_bytes()[:2000])
    bad(rf"^root: {images}/000005.jpg is not a readable image \(image file is truncated", root=str(folder))
    Image.new("L", (178, 218)).save(images / "000005.jpg", format="PNG")
    gray, _ = CelebA(str(folder)).test[0]  # grayscale converted to RGB, as PIL's .convert('RGB')
    assert gray.shape == (3, 64, 64)
    # an image that is not the first of its split fails when loaded, with the same one line
    Image.new("RGB", (218, 218)).save(images / "000002.jpg", format="JPEG")
    tasks = CelebA(str(folder))
    with pytest.raises(ValueError, match=rf"^root: {images}/000002.jpg is 218x218"):
        tasks.train[1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"image_size": [64]}, r"^image_size: must be \[height, width\], two integers > 0, got \[64\]"),
        ({"image_size": [64, 0]}, r"^image_size: must be"),
        (
            {"attributes": ["Smiling", "Smile"]},
            r"^attributes: unknown Smile; null \(all 40\) or names of 5_o_Clock_Shadow",
        ),
        ({"attributes": []}, r"^attributes: empty or repeated"),
        (
            {"metrics": ["accuracy", "auc"]},
            r"^metrics: must be a non-empty list of distinct names among accuracy, error, f1",
        ),
    ],
)
def test_bad_options_name_their_argument(root, kwargs, message):
    bad(message, root=str(root), **kwargs)


def test_the_config_error_is_one_line_naming_tasks_root(compose_cfg, tmp_path):
    cfg = compose_cfg("tasks=celeba", f"tasks.root={tmp_path / 'nowhere'}")
    with pytest.raises(ConfigError, match=rf"^tasks.root: {tmp_path}/nowhere does not exist; expected torchvision's"):
        build("tasks", cfg.tasks)


def test_shipped_reference_is_null(compose_cfg):
    assert compose_cfg("tasks=celeba").tasks.reference is None


# ----------------------------------------------------------------------------------------------- model


def famo_network_modules():
    """FAMO models.py Network.shared_base: module types and (in, out) widths, in order."""
    conv = lambda i, o: [("Conv2d", i, o), ("BatchNorm2d", o, o), ("ReLU",)]  # noqa: E731
    linear = lambda i, o: [("Linear", i, o), ("BatchNorm1d", o, o), ("ReLU",)]  # noqa: E731
    pool = [("MaxPool2d",)]
    return [
        *conv(3, 64),
        *pool,
        *conv(64, 128),
        *conv(128, 128),
        *pool,
        *conv(128, 256),
        *conv(256, 256),
        *pool,
        *conv(256, 512),
        *conv(512, 512),
        ("AdaptiveAvgPool2d",),
        ("Flatten",),
        *linear(512, 512),
        *linear(512, 512),
    ]


def describe(module):
    name = type(module).__name__
    if isinstance(module, nn.Conv2d):
        assert module.kernel_size == (3, 3) and module.padding == (1, 1) and module.bias is None
        return (name, module.in_channels, module.out_channels)
    if isinstance(module, nn.Linear):
        assert module.bias is None
        return (name, module.in_features, module.out_features)
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        return (name, module.num_features, module.num_features)
    return (name,)


def test_the_model_is_famos_network():
    model = CelebACNN((3, 64, 64), {name: 1 for name in ATTRIBUTES})
    assert [describe(m) for m in model.trunk] == famo_network_modules()
    # FAMO's counts: convs 9 * (3*64 + 64*128 + 128*128 + 128*256 + 256*256 + 256*512 + 512*512), batch norms
    # 2 * (64 + 2*128 + 2*256 + 2*512 + 2*512), linears 2 * 512*512; heads 40 * (512 + 1)
    convs = 9 * (3 * 64 + 64 * 128 + 128 * 128 + 128 * 256 + 256 * 256 + 256 * 512 + 512 * 512)
    assert sum(p.numel() for p in model.shared_parameters()) == convs + 2 * (64 + 256 + 512 + 2048) + 2 * 512 * 512
    assert sum(p.numel() for p in model.heads.parameters()) == 40 * 513
    assert model.last_shared_layer is model.trunk[-3] and isinstance(model.last_shared_layer, nn.Linear)
    out = model.eval()(torch.rand(2, 3, 64, 64))
    assert out.shared.shape == (2, 512) and all(p.shape == (2, 1) for p in out.preds.values())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_shape": (3, 7, 64)}, "^input_shape: height and width must be >= 8"),
        ({"input_shape": (64, 64)}, "^input_shape: CelebACNN needs"),
        ({"channels": [4, 4, 4]}, "^channels: must be four integers > 0"),
        ({"channels": [4, 4, 0, 4]}, "^channels:"),
        ({"hidden": 0}, "^hidden: must be an integer > 0"),
    ],
)
def test_bad_model_options_name_their_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CelebACNN(**{"input_shape": (3, 64, 64), "heads": {"a": 1}, **kwargs})


# ----------------------------------------------------------------------------------------------- training


def test_the_preset_trains_two_steps_with_every_metric(compose_cfg, tmp_path, original_root):
    """experiment=celeba_cnn on the tiny tree (its model narrowed: the test is about the plumbing)."""
    overrides = [
        "experiment=celeba_cnn",
        f"tasks.root={original_root.parent / original_root.name}",
        "tasks.metrics=[accuracy,error,f1]",
        "model.channels=[4,4,4,4]",
        "model.hidden=8",
        "trainer.epochs=null",
        "trainer.max_steps=2",
        "trainer.batch_size=2",
        "trainer.eval_every=2",
        "trainer.log_every=1",
        "trainer.checkpoint_every=0",
        "trainer.num_workers=0",
        "trainer.device=cpu",
    ]
    cfg = compose_cfg(*overrides)
    assert cfg.optim.lr == 3.0e-4 and cfg.model._target_ == "mtl_bench.models.CelebACNN"
    result = train(cfg, tmp_path, overrides=overrides)
    assert result.step == 2
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "completed"
    for split in ("val", "test"):
        assert sorted(metrics[split]) == sorted(ATTRIBUTES)
        assert all(sorted(values) == ["accuracy", "error", "f1", "loss"] for values in metrics[split].values())
        assert all(math.isfinite(v) for values in metrics[split].values() for v in values.values())
        assert all(v["accuracy"] + v["error"] == pytest.approx(1) for v in metrics[split].values())
    assert metrics["higher_is_better"]["Young"] == {"loss": False, "accuracy": True, "error": False, "f1": True}
    assert not metrics.get("reference")


def test_the_preset_keeps_famos_recipe(compose_cfg):
    cfg = OmegaConf.to_container(compose_cfg("experiment=celeba_cnn"), resolve=False)
    assert cfg["trainer"]["batch_size"] == 256 and cfg["trainer"]["epochs"] == 15
    assert to_steps("trainer.eval_every", cfg["trainer"]["eval_every"], 162_770 // 256) == 162_770 // 256
    assert cfg["optim"]["_target_"] == "torch.optim.Adam" and cfg["optim"]["lr"] == 3e-4
    assert cfg["optim"]["weight_decay"] == 0.0 and cfg["optim"]["schedule"]["_target_"] == "mtl_bench.optim.Constant"
    assert cfg["tasks"]["image_size"] == [64, 64] and cfg["model"]["channels"] == [64, 128, 256, 512]
