"""tasks=office31 and tasks=office_home on tiny trees in the real layout (real JPEGs in the real domain and class
folders): items against an independent decode (PIL, LibMTL's transform), labels from the class folders, the
seeded split's per-class proportions, LibMTL's split files, bad input (one line naming the path and what was
expected, before training), the presets, and training steps through the engine (step_mode=per_task)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from mtl_bench.engine.builders import build
from mtl_bench.engine.compose import finalise_config
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError
from mtl_bench.settings import to_steps
from mtl_bench.tasks.office31 import CLASSES as OFFICE31_CLASSES
from mtl_bench.tasks.office31 import Office31
from mtl_bench.tasks.office_home import CLASSES as OFFICE_HOME_CLASSES
from mtl_bench.tasks.office_home import OfficeHome
from tests.helpers.office_tree import write_office31, write_office_home, write_split_files

MEAN = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
STD = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
# LibMTL's own numbering of the Office-31 classes (its data_txt files): not the sorted order
LIBMTL_LABELS = {"back_pack": 0, "bike": 27, "mug": 22}


@pytest.fixture(scope="module")
def o31(tmp_path_factory):
    return write_office31(tmp_path_factory.mktemp("office31"), per_class=5)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return write_office_home(tmp_path_factory.mktemp("office_home"), per_class=5)


def libmtl_transform(path: Path) -> torch.Tensor:
    """LibMTL's create_dataset.py: Image.open(...).convert('RGB'), then torchvision's (v1) Resize((224, 224)),
    ToTensor and Normalize (ImageNet statistics)."""
    from torchvision import transforms

    transform = transforms.Compose(
        [
            transforms.Resize((224, 224)),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    return transform(Image.open(path).convert("RGB"))


def on_disk(directory: Path) -> set[Path]:
    return {p for p in directory.rglob("*.jpg")}


def test_office31_tasks_items_and_labels(o31):
    tasks = Office31(str(o31))
    assert tasks.task_names == ["amazon", "dslr", "webcam"] and tasks.multi_input
    assert tasks.input_shape == (3, 224, 224)
    for task in tasks.tasks:
        assert task.out_dim == 31 and task.higher_is_better == {"accuracy": True}
        assert task.initial_loss == pytest.approx(math.log(31))
    for split in (tasks.train, tasks.val, tasks.test):
        assert set(split) == {"amazon", "dslr", "webcam"}
    assert [len(tasks.train["dslr"]), len(tasks.val["dslr"]), len(tasks.test["dslr"])] == [9, 3, 3]
    dataset = tasks.test["webcam"]
    for i in range(len(dataset)):
        image, target = dataset[i]
        path = dataset.paths[i]
        assert image.shape == (3, 224, 224) and image.dtype == torch.float32
        assert list(target) == ["webcam"] and target["webcam"].dtype == torch.int64 and target["webcam"].dim() == 0
        assert path.parent.parent == o31 / "webcam" / "images"
        assert int(target["webcam"]) == sorted(OFFICE31_CLASSES).index(path.parent.name)  # ImageFolder's order
        assert torch.allclose(image, libmtl_transform(path), atol=1e-6)  # LibMTL's pixels
    labels = torch.stack([tasks.train["amazon"][i][1]["amazon"] for i in range(9)])
    assert sorted(set(labels.tolist())) == [0, 1, 17]  # back_pack, bike, mug among the 31 sorted names


def test_a_grayscale_jpeg_is_read_as_rgb(o31):
    tasks = Office31(str(o31))
    path = o31 / "amazon" / "images" / "bike" / "frame_0002.jpg"
    assert Image.open(path).mode == "L"
    dataset = next(split["amazon"] for split in (tasks.train, tasks.val, tasks.test) if path in split["amazon"].paths)
    i = dataset.paths.index(path)
    image = dataset[i][0] * STD + MEAN  # undo the normalization: the three channels are the same gray
    assert torch.allclose(image[0], image[1], atol=1e-5) and torch.allclose(image[1], image[2], atol=1e-5)


def test_seeded_split_has_libmtls_per_class_proportions(tmp_path):
    root = write_office31(tmp_path / "a", per_class=7, classes=("bike", "mug"))
    tasks = Office31(str(root), split_seed=3)
    for domain in ("amazon", "dslr", "webcam"):
        splits = {
            name: split[domain].paths
            for name, split in (("train", tasks.train), ("val", tasks.val), ("test", tasks.test))
        }
        every = [p for paths in splits.values() for p in paths]
        assert len(every) == len(set(every)) and set(every) == on_disk(root / domain)  # disjoint, all images
        for cls in ("bike", "mug"):
            counts = [sum(p.parent.name == cls for p in paths) for paths in splits.values()]
            assert counts == [int(0.6 * 7), int(0.2 * 7), 7 - int(0.6 * 7) - int(0.2 * 7)]  # 4, 1, 2
    again = Office31(str(root), split_seed=3)
    assert again.val["dslr"].paths == tasks.val["dslr"].paths
    others = [Office31(str(root), split_seed=s).train["amazon"].paths for s in (4, 5)]
    assert any(paths != tasks.train["amazon"].paths for paths in others)
    # a class's split does not depend on the other classes being there
    alone = Office31(str(write_office31(tmp_path / "b", per_class=7, classes=("mug",))), split_seed=3)
    names = [p.name for p in alone.test["webcam"].paths]
    assert names == [p.name for p in tasks.test["webcam"].paths if p.parent.name == "mug"]


def test_office_home_reads_real_world_with_a_space_or_an_underscore(home, tmp_path):
    tasks = OfficeHome(str(home))
    assert tasks.task_names == ["Art", "Clipart", "Product", "Real_World"]
    assert all(t.out_dim == 65 and t.initial_loss == pytest.approx(math.log(65)) for t in tasks.tasks)
    dataset = tasks.train["Real_World"]
    assert {p.parent.parent for p in dataset.paths} == {home / "Real World"}
    for i in range(len(dataset)):
        assert int(dataset[i][1]["Real_World"]) == sorted(OFFICE_HOME_CLASSES).index(dataset.paths[i].parent.name)
    assert sorted(OFFICE_HOME_CLASSES).index("TV") < sorted(OFFICE_HOME_CLASSES).index("Table")  # Python's order
    renamed = write_office_home(tmp_path, per_class=5, real_world="Real_World")
    assert {p.parent.parent for p in OfficeHome(str(renamed)).test["Real_World"].paths} == {renamed / "Real_World"}


def test_preload_gives_the_same_items(home):
    lazy, kept = OfficeHome(str(home)), OfficeHome(str(home), preload=True)
    assert kept.val["Clipart"].images is not None and kept.val["Clipart"].images.dtype == torch.uint8
    for i in range(len(lazy.val["Clipart"])):
        a, b = lazy.val["Clipart"][i], kept.val["Clipart"][i]
        assert torch.equal(a[0], b[0]) and torch.equal(a[1]["Clipart"], b[1]["Clipart"])


def test_image_size_option(o31):
    tasks = Office31(str(o31), image_size=32)
    assert tasks.input_shape == (3, 32, 32) and tasks.train["amazon"][0][0].shape == (3, 32, 32)


# ----------------------------------------------------------------------------------------------- split files


def libmtl_rows(root: Path, domains=("amazon", "dslr", "webcam")) -> dict:
    """A split in LibMTL's format: per class, files 1-3 train, 4 val, 5 test; LibMTL's own labels."""
    rows = {}
    for domain in domains:
        rows[domain] = {"train": [], "val": [], "test": []}
        for path in sorted(on_disk(root / domain)):
            number = int(path.stem.split("_")[-1])
            split = "train" if number <= 3 else "val" if number == 4 else "test"
            rows[domain][split].append((path.relative_to(root).as_posix(), LIBMTL_LABELS[path.parent.name]))
    return rows


def test_libmtl_split_files_choose_the_images_and_labels_follow_the_folders(o31, tmp_path):
    folder = write_split_files(tmp_path / "office-31", libmtl_rows(o31))
    assert (folder / "amazon_train.txt").read_text().splitlines()[0] == "amazon/images/back_pack/frame_0001.jpg 0"
    tasks = Office31(str(o31), split_files=str(folder))
    for name, split in (("train", tasks.train), ("val", tasks.val), ("test", tasks.test)):
        want = {"train": {1, 2, 3}, "val": {4}, "test": {5}}[name]
        for domain, dataset in split.items():
            assert {int(p.stem[-4:]) for p in dataset.paths} == want and len(dataset) == 3 * len(want)
            for i in range(len(dataset)):  # sorted-name labels, not LibMTL's numbers
                assert int(dataset[i][1][domain]) == sorted(OFFICE31_CLASSES).index(dataset.paths[i].parent.name)


def test_libmtl_real_world_paths_map_onto_the_real_world_folder(home, tmp_path):
    labels = {"Alarm_Clock": 62, "TV": 60, "Table": 4}  # LibMTL's numbers for these classes
    rows = {}
    for domain in ("Art", "Clipart", "Product", "Real_World"):
        folder = home / ("Real World" if domain == "Real_World" else domain)
        files = sorted(on_disk(folder))
        lines = [(f"{domain}/{p.parent.name}/{p.name}", labels[p.parent.name]) for p in files]
        rows[domain] = {"train": lines[:9], "val": lines[9:12], "test": lines[12:]}
    tasks = OfficeHome(str(home), split_files=str(write_split_files(tmp_path / "office-home", rows)))
    assert len(tasks.train["Real_World"]) == 9 and tasks.val["Real_World"].paths[0].parent.parent == home / "Real World"


def bad(message: str, tasks=Office31, **kwargs):
    with pytest.raises(ValueError, match=message) as info:
        tasks(**kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_bad_split_files_name_the_file_and_line(o31, tmp_path):
    def files(name: str, edit=None):
        rows = libmtl_rows(o31)
        if edit:
            edit(rows)
        return str(write_split_files(tmp_path / name, rows))

    bad(
        rf"^split_files: {tmp_path}/nowhere does not exist; expected LibMTL's data_txt/office-31 folder: "
        r"\{amazon,dslr,webcam\}_\{train,val,test\}.txt",
        root=str(o31),
        split_files=str(tmp_path / "nowhere"),
    )
    folder = Path(files("a"))
    (folder / "dslr_val.txt").unlink()
    bad(rf"^split_files: {folder} has no dslr_val.txt", root=str(o31), split_files=str(folder))
    (folder / "dslr_val.txt").write_text("\n")
    bad(rf"^split_files: {folder}/dslr_val.txt lists no images", root=str(o31), split_files=str(folder))
    (folder / "dslr_val.txt").write_text("dslr/images/bike/frame_0004.jpg\n")
    bad(
        rf"^split_files: {folder}/dslr_val.txt:1 reads 'dslr/images/bike/frame_0004.jpg', not '<path> <label>'",
        root=str(o31),
        split_files=str(folder),
    )
    (folder / "dslr_val.txt").write_text("dslr/images/bike/frame_0004.jpg 27\ndslr/images/bike/frame_0009.jpg 27\n")
    bad(
        rf"^split_files: {folder}/dslr_val.txt:2 names dslr/images/bike/frame_0009.jpg, which is not at "
        rf"{o31}/dslr/images/bike/frame_0009.jpg under tasks.root",
        root=str(o31),
        split_files=str(folder),
    )
    (folder / "dslr_val.txt").write_text("webcam/images/bike/frame_0004.jpg 27\n")
    bad(
        r"dslr_val.txt:1 names webcam/images/bike/frame_0004.jpg, not an image of the dslr domain",
        root=str(o31),
        split_files=str(folder),
    )
    (folder / "dslr_val.txt").write_text("dslr/images/bicycle/frame_0004.jpg 27\n")
    bad(
        r"dslr_val.txt:1 names dslr/images/bicycle/frame_0004.jpg: bicycle is not a Office-31 class",
        root=str(o31),
        split_files=str(folder),
    )
    (folder / "dslr_val.txt").write_text("dslr/images/bike/frame_0004.jpg 5\n")
    bad(r"dslr_val.txt:1 gives bike label 5, .*amazon_train.txt:4 gave it 27", root=str(o31), split_files=str(folder))
    (folder / "dslr_val.txt").write_text("dslr/images/bike/frame_0001.jpg 27\n")
    bad(
        r"dslr_val.txt:1 names dslr/images/bike/frame_0001.jpg, already listed at .*dslr_train.txt:4",
        root=str(o31),
        split_files=str(folder),
    )

    def two_classes_one_label(rows):
        rows["webcam"]["test"] = [(p, 0) for p, _ in rows["webcam"]["test"]]

    bad(r"gives (bike|mug) label 0, .*gave it (27|22)", root=str(o31), split_files=files("b", two_classes_one_label))

    def mug_as_zero(rows):
        for domain in rows.values():
            for lines in domain.values():
                lines[:] = [(p, 0 if "/mug/" in p else label) for p, label in lines]

    bad(
        r"gives (back_pack|mug) label 0, which another file gives (mug|back_pack)",
        root=str(o31),
        split_files=files("c", mug_as_zero),
    )


# ----------------------------------------------------------------------------------------------- bad trees


def test_root_missing_or_not_there(tmp_path):
    bad(
        r"^root: not set: give the folder that holds the domain folders, e.g. tasks.root=/data/office31; expected "
        r"the Office-31 layout \{amazon,dslr,webcam\}/images/<class>/<image>.jpg, up to 31 class folders per domain$"
    )
    bad(
        rf"^root: {tmp_path}/nowhere does not exist; expected the Office-Home layout "
        r"\{Art,Clipart,Product,Real_World\}/<class>/<image>.jpg",
        OfficeHome,
        root=str(tmp_path / "nowhere"),
    )
    (tmp_path / "file").write_text("")
    bad(r"^root: .*/file is not a directory", root=str(tmp_path / "file"))


def test_the_wrong_layout_is_named(o31, home, tmp_path):
    bad(
        rf"^root: {home} has no amazon, dslr, webcam folder \(it has: Art, Clipart, Product, Real World\) \(an "
        r"Office-Home tree\? that is tasks=office_home\); expected the Office-31 layout",
        root=str(home),
    )
    bad(
        rf"^root: {o31} has no Art, Clipart, Product, Real_World or Real World folder \(it has: amazon, dslr, webcam\) "
        r"\(an Office-31 tree\? that is tasks=office31\); expected the Office-Home layout",
        OfficeHome,
        root=str(o31),
    )
    nested = write_office31(tmp_path / "download" / "domain_adaptation_images", per_class=5, classes=("mug",))
    bad(
        rf"^root: {tmp_path}/download has no amazon, dslr, webcam folder \(it has: domain_adaptation_images\) \(the "
        rf"domain folders are in {nested}: tasks.root={nested}\)",
        root=str(tmp_path / "download"),
    )
    (tmp_path / "npy" / "train" / "image").mkdir(parents=True)
    bad(
        rf"^root: {tmp_path}/npy has no amazon, dslr, webcam folder \(it has: train\); expected",
        root=str(tmp_path / "npy"),
    )


def test_bad_class_folders_and_empty_ones(tmp_path):
    root = write_office31(tmp_path / "a", per_class=5, classes=("mug",))
    (root / "dslr" / "images" / "Mug").mkdir()
    (root / "dslr" / "images" / "Mug" / "x.jpg").write_bytes(b"")
    bad(
        rf"^root: {root}/dslr/images holds folders that are not Office-31 classes: Mug \(its classes: back_pack, "
        r"bike, bike_helmet, ...\); expected the Office-31 layout",
        root=str(root),
    )
    (root / "dslr" / "images" / "Mug" / "x.jpg").unlink()
    (root / "dslr" / "images" / "Mug").rename(root / "dslr" / "images" / "pen")
    (root / "dslr" / "images" / "pen" / "notes.txt").write_text("not an image")
    bad(rf"^root: {root}/dslr/images/pen holds no images \(.jpg, .jpeg, .png, ...\)", root=str(root))
    empty = write_office31(tmp_path / "b", per_class=5, classes=("mug",), domains=("amazon", "dslr"))
    (empty / "webcam" / "images").mkdir(parents=True)
    bad(rf"^root: {empty}/webcam/images holds no class folders", root=str(empty))


def test_a_split_with_no_images(tmp_path):
    root = write_office31(tmp_path, per_class=4, classes=("bike", "mug"))  # int(0.2 * 4) = 0 val images per class
    bad(
        rf"^root: the seeded split leaves no val images in {root}/amazon/images \(8 images in 2 classes; per class "
        r"int\(0.6 n\) train, int\(0.2 n\) val, the rest test\); expected the Office-31 layout",
        root=str(root),
    )


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"not an image at all", "not an image format PIL reads"),
        (None, "the file is truncated"),
    ],
)
def test_an_image_that_cannot_be_decoded(tmp_path, content, reason):
    root = write_office31(tmp_path, per_class=5, classes=("mug",))
    path = root / "webcam" / "images" / "mug" / "frame_0003.jpg"
    path.write_bytes(content if content is not None else path.read_bytes()[: len(path.read_bytes()) // 2])
    bad(rf"^root: {path} cannot be decoded as an image \({reason}\); expected the Office-31 layout", root=str(root))
    bad(rf"^root: {path} cannot be decoded as an image", root=str(root), preload=True)
    tasks = Office31(str(root), check_images=False)  # not checked here: the loader's read names the file
    dataset = next(d for split in (tasks.train, tasks.val, tasks.test) for d in [split["webcam"]] if path in d.paths)
    with pytest.raises(ValueError, match=rf"^root: {path} cannot be decoded as an image \({reason}\)"):
        dataset[dataset.paths.index(path)]


def test_bad_options_name_their_key(o31):
    bad(r"^split_seed: must be an integer >= 0, got -1", root=str(o31), split_seed=-1)
    bad(r"^image_size: must be a number of pixels >= 1 \(LibMTL: 224\), got 0", root=str(o31), image_size=0)


def test_the_config_error_is_one_line_naming_tasks_root(compose_cfg, tmp_path):
    cfg = compose_cfg("tasks=office_home", f"tasks.root={tmp_path / 'nowhere'}")
    with pytest.raises(ConfigError, match=rf"^tasks.root: {tmp_path}/nowhere does not exist; expected the Office-Home"):
        build("tasks", cfg.tasks)


# ----------------------------------------------------------------------------------------------- config


def test_shipped_references_name_every_domain_and_are_fractions(compose_cfg):
    for option, domains in (
        ("office31", ["amazon", "dslr", "webcam"]),
        ("office_home", ["Art", "Clipart", "Product", "Real_World"]),
    ):
        reference = OmegaConf.to_container(compose_cfg(f"tasks={option}").tasks.reference)
        assert list(reference) == domains
        assert all(list(v) == ["accuracy"] and 0.5 < v["accuracy"] < 1 for v in reference.values())
    mean = sum(v["accuracy"] for v in OmegaConf.to_container(compose_cfg("tasks=office31").tasks.reference).values())
    assert mean / 3 == pytest.approx(0.9303, abs=5e-5)  # the paper's printed average


@pytest.mark.parametrize(("preset", "largest_train"), [("office31_resnet18", 1680), ("office_home_resnet18", 2635)])
def test_presets_follow_libmtl(compose_cfg, preset, largest_train):
    cfg = compose_cfg(f"experiment={preset}")
    assert cfg.trainer.step_mode == "per_task" and cfg.trainer.batch_size == 64 and cfg.trainer.epochs == 100
    assert cfg.optim.lr == 1e-4 and cfg.optim.weight_decay == 1e-5 and cfg.optim._target_ == "torch.optim.Adam"
    assert cfg.optim.schedule._target_ == "mtl_bench.optim.Constant"
    # one evaluation per LibMTL epoch: the largest domain's training images (LibMTL's split files) // 64 steps
    assert to_steps("trainer.eval_every", cfg.trainer.eval_every, largest_train // 64) == largest_train // 64
    assert cfg.model._target_ == "mtl_bench.models.ResNet18"


# ----------------------------------------------------------------------------------------------- training


def short_run(compose_cfg, *overrides: str):
    overrides = (
        "model._target_=tests.helpers.office_tree.TinyClassifier",
        "trainer=smoke",
        "trainer.max_steps=2",
        "trainer.batch_size=2",
        "trainer.log_every=1",
        "trainer.eval_every=2",
        "trainer.eval_batch_size=4",
        "trainer.device=cpu",
        "trainer.step_mode=per_task",
        *overrides,
    )
    cfg = compose_cfg(*overrides)
    finalise_config(
        cfg, list(overrides)
    )  # as train() does: drops the mlp option's keys that TinyClassifier does not take
    return cfg


@pytest.mark.parametrize("workers", [0, 2])
def test_office31_trains_two_per_task_steps(compose_cfg, tmp_path, o31, workers):
    cfg = short_run(
        compose_cfg, "tasks=office31", f"tasks.root={o31}", "tasks.image_size=32", f"trainer.num_workers={workers}"
    )
    result = train(cfg, tmp_path)
    assert result.step == 2
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "completed"
    for split in ("val", "test"):
        assert {task: sorted(values) for task, values in metrics[split].items()} == {
            task: ["accuracy", "loss"] for task in ("amazon", "dslr", "webcam")
        }
        assert all(0 <= values["accuracy"] <= 1 and math.isfinite(values["loss"]) for values in metrics[split].values())
    assert metrics["reference"]["dslr"] == {"accuracy": 0.9563}
    assert metrics["higher_is_better"]["webcam"]["accuracy"] is True
