"""Dense-prediction losses and metrics (mtl_bench/tasks/dense/): hand-computed tiny cases, and the
references' own code on the same tensors.

Test oracles, copied verbatim (only reformatted) from the public repositories named at each, used here and
nowhere else:
- AvivNavon/nash-mtl @ cce18403ef5557a6b30f4ba43b896117107d6902: experiments/nyuv2/utils.py (ConfMatrix,
  depth_error, normal_error) and experiments/nyuv2/trainer.py (calc_loss, the test loop's averaging).
- median-research-group/LibMTL @ 4336804847eaa5e0b924b743d76beec7ac3fdc97: examples/nyu/utils.py
  (DepthMetric, NormalMetric: update_fun / score_fun).
- lorenmt/mtan @ c36c30baa18968dec74fe9039abcfd4f132edfa1: im2im_pred/create_dataset.py (RandomScaleCrop and
  the flip in NYUv2.__getitem__).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mtl_bench.tasks.dense import (
    HIST_BIN_DEGREES,
    depth_task,
    hflip,
    histogram_median,
    mtan_augment,
    normal_task,
    scale_crop,
    segmentation_task,
)

# ----------------------------------------------------------------------------------------------- oracles


class ConfMatrix(object):  # nash-mtl experiments/nyuv2/utils.py
    def __init__(self, num_classes):
        self.num_classes = num_classes
        self.mat = None

    def update(self, pred, target):
        n = self.num_classes
        if self.mat is None:
            self.mat = torch.zeros((n, n), dtype=torch.int64, device=pred.device)
        with torch.no_grad():
            k = (target >= 0) & (target < n)
            inds = n * target[k].to(torch.int64) + pred[k]
            self.mat += torch.bincount(inds, minlength=n**2).reshape(n, n)

    def get_metrics(self):
        h = self.mat.float()
        acc = torch.diag(h).sum() / h.sum()
        iu = torch.diag(h) / (h.sum(1) + h.sum(0) - torch.diag(h))
        return torch.mean(iu).cpu().numpy(), acc.cpu().numpy()


def depth_error(x_pred, x_output):  # nash-mtl experiments/nyuv2/utils.py
    device = x_pred.device
    binary_mask = (torch.sum(x_output, dim=1) != 0).unsqueeze(1).to(device)
    x_pred_true = x_pred.masked_select(binary_mask)
    x_output_true = x_output.masked_select(binary_mask)
    abs_err = torch.abs(x_pred_true - x_output_true)
    rel_err = torch.abs(x_pred_true - x_output_true) / x_output_true
    return (torch.sum(abs_err) / torch.nonzero(binary_mask, as_tuple=False).size(0)).item(), (
        torch.sum(rel_err) / torch.nonzero(binary_mask, as_tuple=False).size(0)
    ).item()


def normal_error(x_pred, x_output):  # nash-mtl experiments/nyuv2/utils.py
    binary_mask = torch.sum(x_output, dim=1) != 0
    error = (
        torch.acos(torch.clamp(torch.sum(x_pred * x_output, 1).masked_select(binary_mask), -1, 1))
        .detach()
        .cpu()
        .numpy()
    )
    error = np.degrees(error)
    return (
        np.mean(error),
        np.median(error),
        np.mean(error < 11.25),
        np.mean(error < 22.5),
        np.mean(error < 30),
    )


def calc_loss(x_pred, x_output, task_type):  # nash-mtl experiments/nyuv2/trainer.py
    device = x_pred.device

    # binary mark to mask out undefined pixel space
    binary_mask = (torch.sum(x_output, dim=1) != 0).float().unsqueeze(1).to(device)

    if task_type == "semantic":
        # semantic loss: depth-wise cross entropy
        loss = F.nll_loss(x_pred, x_output, ignore_index=-1)

    if task_type == "depth":
        # depth loss: l1 norm
        loss = torch.sum(torch.abs(x_pred - x_output) * binary_mask) / torch.nonzero(binary_mask, as_tuple=False).size(
            0
        )

    if task_type == "normal":
        # normal loss: dot product
        loss = 1 - torch.sum((x_pred * x_output) * binary_mask) / torch.nonzero(binary_mask, as_tuple=False).size(0)

    return loss


class DepthMetric:  # LibMTL examples/nyu/utils.py (AbsMetric's record/bs lists inlined)
    def __init__(self):
        self.abs_record, self.rel_record, self.bs = [], [], []

    def update_fun(self, pred, gt):
        device = pred.device
        binary_mask = (torch.sum(gt, dim=1) != 0).unsqueeze(1).to(device)
        pred = pred.masked_select(binary_mask)
        gt = gt.masked_select(binary_mask)
        abs_err = torch.abs(pred - gt)
        rel_err = torch.abs(pred - gt) / gt
        abs_err = (torch.sum(abs_err) / torch.nonzero(binary_mask, as_tuple=False).size(0)).item()
        rel_err = (torch.sum(rel_err) / torch.nonzero(binary_mask, as_tuple=False).size(0)).item()
        self.abs_record.append(abs_err)
        self.rel_record.append(rel_err)
        self.bs.append(pred.size()[0])

    def score_fun(self):
        records = np.stack([np.array(self.abs_record), np.array(self.rel_record)])
        batch_size = np.array(self.bs)
        return [(records[i] * batch_size).sum() / (sum(batch_size)) for i in range(2)]


class NormalMetric:  # LibMTL examples/nyu/utils.py
    def __init__(self):
        self.record = []

    def update_fun(self, pred, gt):
        # gt has been normalized on the NYUv2 dataset
        pred = pred / torch.norm(pred, p=2, dim=1, keepdim=True)
        binary_mask = torch.sum(gt, dim=1) != 0
        error = (
            torch.acos(torch.clamp(torch.sum(pred * gt, 1).masked_select(binary_mask), -1, 1)).detach().cpu().numpy()
        )
        error = np.degrees(error)
        self.record.append(error)

    def score_fun(self):
        records = np.concatenate(self.record)
        return [
            np.mean(records),
            np.median(records),
            np.mean((records < 11.25) * 1.0),
            np.mean((records < 22.5) * 1.0),
            np.mean((records < 30) * 1.0),
        ]


class RandomScaleCrop(object):  # mtan im2im_pred/create_dataset.py
    def __init__(self, scale=[1.0, 1.2, 1.5]):
        self.scale = scale

    def __call__(self, img, label, depth, normal):
        height, width = img.shape[-2:]
        sc = self.scale[random.randint(0, len(self.scale) - 1)]
        h, w = int(height / sc), int(width / sc)
        i = random.randint(0, height - h)
        j = random.randint(0, width - w)
        img_ = F.interpolate(
            img[None, :, i : i + h, j : j + w], size=(height, width), mode="bilinear", align_corners=True
        ).squeeze(0)
        label_ = (
            F.interpolate(label[None, None, i : i + h, j : j + w], size=(height, width), mode="nearest")
            .squeeze(0)
            .squeeze(0)
        )
        depth_ = F.interpolate(depth[None, :, i : i + h, j : j + w], size=(height, width), mode="nearest").squeeze(0)
        normal_ = F.interpolate(
            normal[None, :, i : i + h, j : j + w], size=(height, width), mode="bilinear", align_corners=True
        ).squeeze(0)
        return img_, label_, depth_ / sc, normal_


def mtan_flip(image, semantic, depth, normal):  # mtan im2im_pred/create_dataset.py, NYUv2.__getitem__
    image = torch.flip(image, dims=[2])
    semantic = torch.flip(semantic, dims=[1])
    depth = torch.flip(depth, dims=[2])
    normal = torch.flip(normal, dims=[2])
    normal[0, :, :] = -normal[0, :, :]
    return image, semantic, depth, normal


def reference_test_loop(preds, targets, batch, num_classes):
    """Nash-MTL's test loop (trainer.py): ConfMatrix over the split; depth and normal errors per loader batch of
    `batch` images (shuffle=False), averaged over batches in a float32 array (avg_cost += cost / test_batch)."""
    n = len(targets["segmentation"])
    test_batch = math.ceil(n / batch)
    avg = np.zeros(7, dtype=np.float32)
    conf_mat = ConfMatrix(num_classes)
    for start in range(0, n, batch):
        rows = slice(start, start + batch)
        conf_mat.update(preds["segmentation"][rows].argmax(1).flatten(), targets["segmentation"][rows].flatten())
        cost = np.zeros(7, dtype=np.float32)
        cost[0], cost[1] = depth_error(preds["depth"][rows], targets["depth"][rows])
        cost[2:] = normal_error(
            F.normalize(preds["normal"][rows], dim=1), targets["normal"][rows]
        )  # the model normalises
        avg += cost / test_batch
    miou, acc = conf_mat.get_metrics()
    names = ["abs_err", "rel_err", "angle_mean", "angle_median", "within_11_25", "within_22_5", "within_30"]
    return {"miou": float(miou), "pixel_acc": float(acc), **dict(zip(names, avg.tolist()))}


# ----------------------------------------------------------------------------------------------- helpers


def run_split(task, preds, targets, chunks):
    """Accumulate `task.metrics` over evaluation batches of sizes `chunks` as the engine does (float32 sums)."""
    sums, start = {}, 0
    for size in chunks:
        values = task.metrics(preds[start : start + size], targets[start : start + size])
        for name, value in values.items():
            sums[name] = sums.get(name, 0.0) + value.detach().float()
        start += size
    assert start == len(preds)
    return {name: float(v) for name, v in task.summarize(sums, len(preds)).items()}


def random_split(n=6, classes=5, height=6, width=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(-1, classes, (n, height, width), generator=gen)
    depth = torch.rand(n, 1, height, width, generator=gen) * 5 + 0.5
    depth[torch.rand(n, 1, height, width, generator=gen) < 0.2] = 0
    normal = F.normalize(torch.randn(n, 3, height, width, generator=gen), dim=1)
    normal[(torch.rand(n, height, width, generator=gen) < 0.2).unsqueeze(1).expand_as(normal)] = 0
    targets = {"segmentation": labels, "depth": depth, "normal": normal}
    preds = {
        "segmentation": torch.randn(n, classes, height, width, generator=gen),
        "depth": torch.rand(n, 1, height, width, generator=gen) * 5,
        "normal": torch.randn(n, 3, height, width, generator=gen) * 2,
    }  # not unit: the tasks normalise
    return preds, targets


# ----------------------------------------------------------------------------------------------- hand-computed


def test_segmentation_by_hand():
    task = segmentation_task(3)
    # target (1 image, 2x3): -1 ignored; argmax prediction below.
    target = torch.tensor([[[0, 0, 1], [2, -1, 1]]])
    predicted = torch.tensor([[[0, 1, 1], [2, 2, 0]]])
    logits = F.one_hot(predicted, 3).permute(0, 3, 1, 2).float()
    # confusion (row target, column prediction) over the 5 counted pixels:
    #   class 0: (0,0) hit, (0,1) -> 1; class 1: (0,2) hit, (1,2) -> 0; class 2: (1,0) hit
    # IoU_0 = 1 / (2 + 2 - 1) = 1/3, IoU_1 = 1 / (2 + 2 - 1) = 1/3, IoU_2 = 1 / (1 + 1 - 1) = 1
    values = run_split(task, logits, target, [1])
    assert values["miou"] == pytest.approx((1 / 3 + 1 / 3 + 1) / 3)
    assert values["pixel_acc"] == pytest.approx(3 / 5)
    # loss: mean over the 5 counted pixels of -log softmax at the target (logits one-hot: e / (e + 2) on a hit)
    hit, miss = -math.log(math.e / (math.e + 2)), -math.log(1 / (math.e + 2))
    assert float(task.loss(logits, target)) == pytest.approx((3 * hit + 2 * miss) / 5)


def test_miou_averages_over_classes_present_where_the_reference_is_nan():
    task = segmentation_task(4)  # class 3 is neither a target nor predicted anywhere
    target = torch.tensor([[[0, 1], [2, 2]]])
    logits = F.one_hot(torch.tensor([[[0, 1], [2, 0]]]), 4).permute(0, 3, 1, 2).float()
    values = run_split(task, logits, target, [1])
    assert values["miou"] == pytest.approx((0.5 + 1 + 0.5) / 3)  # IoU_0 = 1/2, IoU_1 = 1, IoU_2 = 1/2
    reference = ConfMatrix(4)
    reference.update(logits.argmax(1).flatten(), target.flatten())
    miou, acc = reference.get_metrics()
    assert math.isnan(float(miou)) and values["pixel_acc"] == pytest.approx(float(acc)) == 0.75


def test_depth_by_hand_per_pixel_and_per_group():
    # image 0: targets 2, 4, 0 (invalid); image 1: 1, 0 (invalid), 0 (invalid)
    target = torch.tensor([[2.0, 4.0, 0.0], [1.0, 0.0, 0.0]]).reshape(2, 1, 1, 3)
    pred = torch.tensor([[3.0, 2.0, 9.0], [1.5, 7.0, 7.0]]).reshape(2, 1, 1, 3)
    per_pixel = run_split(depth_task(None), pred, target, [2])
    assert per_pixel["abs_err"] == pytest.approx((1 + 2 + 0.5) / 3)
    assert per_pixel["rel_err"] == pytest.approx((0.5 + 0.5 + 0.5) / 3)
    per_image = run_split(depth_task(1), pred, target, [2])  # groups of 1 image: mean of (1.5, 0.5)
    assert per_image["abs_err"] == pytest.approx(((1 + 2) / 2 + 0.5) / 2)
    assert per_image["rel_err"] == pytest.approx(0.5)
    assert float(depth_task(1).loss(pred, target)) == pytest.approx((1 + 2 + 0.5) / 3)


def test_normals_by_hand():
    x, y, z = torch.eye(3)
    c45 = F.normalize(x + y, dim=0)
    #           target  prediction (any length)   angle
    pairs = [
        (x, 5 * x),  # 0
        (x, 2 * c45),  # 45
        (y, x),  # 90
        (z, -z),  # 180
        (torch.zeros(3), x),
    ]  # invalid target
    target = torch.stack([t for t, _ in pairs], dim=1).reshape(1, 3, 1, 5)
    pred = torch.stack([p for _, p in pairs], dim=1).reshape(1, 3, 1, 5)
    values = run_split(normal_task(1), pred, target, [1])
    assert values["angle_mean"] == pytest.approx((0 + 45 + 90 + 180) / 4, abs=1e-4)
    assert values["angle_median"] == pytest.approx((45 + 90) / 2, abs=1e-4)  # even count: mean of the middle two
    assert values["within_11_25"] == values["within_22_5"] == values["within_30"] == pytest.approx(1 / 4)
    # loss: 1 - mean cosine over the 4 valid pixels: cosines 1, cos 45, 0, -1
    assert float(normal_task(1).loss(pred, target)) == pytest.approx(1 - (1 + math.sqrt(0.5) + 0 - 1) / 4)
    histogram = run_split(normal_task(None), pred, target, [1])
    assert histogram["angle_median"] == pytest.approx(67.5, abs=HIST_BIN_DEGREES)
    assert histogram["angle_mean"] == pytest.approx(values["angle_mean"], abs=1e-4)


def test_metric_names_and_directions():
    assert segmentation_task(13).higher_is_better == {"miou": True, "pixel_acc": True}
    assert depth_task(2).higher_is_better == {"abs_err": False, "rel_err": False}
    assert normal_task(2).higher_is_better == {
        "angle_mean": False,
        "angle_median": False,
        "within_11_25": True,
        "within_22_5": True,
        "within_30": True,
    }
    with pytest.raises(ValueError, match=r"^error_batch: must be a number of images >= 1"):
        depth_task(0)


# ----------------------------------------------------------------------------------------------- references


@pytest.mark.parametrize("chunks", [[6], [4, 2], [2, 2, 2]])
def test_per_group_metrics_equal_the_nash_mtl_test_loop(chunks):
    """error_batch=2 over evaluation batches of any even size gives the numbers of Nash-MTL's test loop with
    batch size 2 (mIoU from the split's confusion matrix; errors averaged per batch)."""
    preds, targets = random_split(n=6)
    expected = reference_test_loop(preds, targets, batch=2, num_classes=5)
    got = run_split(segmentation_task(5), preds["segmentation"], targets["segmentation"], chunks)
    got |= run_split(depth_task(2), preds["depth"], targets["depth"], chunks)
    got |= run_split(normal_task(2), preds["normal"], targets["normal"], chunks)
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name


def test_a_last_short_group_counts_as_the_references_last_batch():
    preds, targets = random_split(n=5, seed=1)  # batches of 2: 2, 2, 1
    expected = reference_test_loop(preds, targets, batch=2, num_classes=5)
    got = run_split(depth_task(2), preds["depth"], targets["depth"], [4, 1])
    got |= run_split(normal_task(2), preds["normal"], targets["normal"], [4, 1])
    for name in got:
        assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name


def test_per_pixel_metrics_equal_libmtl():
    """error_batch=None: LibMTL's DepthMetric / NormalMetric over the split; the median within one bin."""
    preds, targets = random_split(n=6, seed=2, height=20, width=30)
    depth, normal = DepthMetric(), NormalMetric()
    for start in range(0, 6, 2):
        rows = slice(start, start + 2)
        depth.update_fun(preds["depth"][rows], targets["depth"][rows])
        normal.update_fun(preds["normal"][rows], targets["normal"][rows])
    expected = dict(zip(["abs_err", "rel_err"], depth.score_fun()))
    expected |= dict(
        zip(["angle_mean", "angle_median", "within_11_25", "within_22_5", "within_30"], normal.score_fun())
    )
    got = run_split(depth_task(None), preds["depth"], targets["depth"], [4, 2])
    got |= run_split(normal_task(None), preds["normal"], targets["normal"], [4, 2])
    for name in expected:
        tolerance = HIST_BIN_DEGREES if name == "angle_median" else 1e-5 * abs(expected[name])
        assert abs(got[name] - expected[name]) <= tolerance, (name, got[name], expected[name])


def test_histogram_median_is_within_one_bin_of_numpy():
    gen = torch.Generator().manual_seed(3)
    for n in (1, 2, 7, 1000, 4001):
        values = torch.rand(n, generator=gen) * 180
        histogram = torch.bincount((values / HIST_BIN_DEGREES).long().clamp(max=17999), minlength=18000)
        assert abs(float(histogram_median(histogram)) - float(np.median(values.numpy()))) < HIST_BIN_DEGREES


def test_losses_equal_nash_mtl_calc_loss():
    preds, targets = random_split(n=4, seed=4)
    seg, depth, normal = segmentation_task(5), depth_task(2), normal_task(2)
    # the references' SegNet ends in log_softmax (nll_loss) and F.normalize for normals: the same numbers here
    assert float(seg.loss(preds["segmentation"], targets["segmentation"])) == pytest.approx(
        float(calc_loss(F.log_softmax(preds["segmentation"], 1), targets["segmentation"], "semantic")), rel=1e-6
    )
    assert float(depth.loss(preds["depth"], targets["depth"])) == pytest.approx(
        float(calc_loss(preds["depth"], targets["depth"], "depth")), rel=1e-6
    )
    unit = F.normalize(preds["normal"], dim=1)
    assert float(normal.loss(preds["normal"], targets["normal"])) == pytest.approx(
        float(calc_loss(unit, targets["normal"], "normal")), rel=1e-6
    )


def test_losses_have_gradients_and_metrics_do_not_need_them():
    preds, targets = random_split(n=2, seed=5)
    for task in (segmentation_task(5), depth_task(2), normal_task(2)):
        pred = preds[task.name].clone().requires_grad_()
        task.loss(pred, targets[task.name]).backward()
        assert pred.grad is not None and torch.isfinite(pred.grad).all()
        assert all(not v.requires_grad for v in task.metrics(pred, targets[task.name]).values())


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="prediction shape"):
        depth_task(2).loss(torch.zeros(2, 1, 4, 4), torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match="prediction shape"):
        segmentation_task(3).metrics(torch.zeros(2, 3, 4, 4), torch.zeros(2, 1, 4, 4, dtype=torch.long))


# ----------------------------------------------------------------------------------------------- augmentation


def sample_tensors(height=12, width=17, seed=6):
    gen = torch.Generator().manual_seed(seed)
    image = torch.rand(3, height, width, generator=gen)
    label = torch.randint(-1, 13, (height, width), generator=gen).float()
    depth = torch.rand(1, height, width, generator=gen) * 4
    normal = F.normalize(torch.randn(3, height, width, generator=gen), dim=0)
    return image, label, depth, normal


@pytest.mark.parametrize("scale", [1.0, 1.2, 1.5])
def test_scale_crop_equals_mtan_random_scale_crop(monkeypatch, scale):
    image, label, depth, normal = sample_tensors()
    h, w = int(12 / scale), int(17 / scale)
    top, left = 12 - h, (17 - w) // 2
    draws = iter([[1.0, 1.2, 1.5].index(scale), top, left])
    monkeypatch.setattr(random, "randint", lambda a, b: next(draws))
    expected = RandomScaleCrop()(image, label, depth, normal)
    got = scale_crop(image, label, depth, normal, scale, top, left)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    flipped = hflip(*got)
    for a, b in zip(flipped, mtan_flip(*[t.clone() for t in expected])):
        assert torch.equal(a, b)


def test_augmentation_draws_come_from_torch_and_keep_the_shapes():
    image, label, depth, normal = sample_tensors()
    torch.manual_seed(0)
    first = mtan_augment(image, label, depth, normal)
    torch.manual_seed(0)
    again = mtan_augment(image, label, depth, normal)
    for a, b, original in zip(first, again, (image, label, depth, normal)):
        assert torch.equal(a, b) and a.shape == original.shape
    # over many samples every draw shows: constant depth 3 becomes 3/scale, a constant normal +x becomes -x on a flip
    flat_depth, plus_x = torch.full_like(depth, 3.0), torch.zeros_like(normal)
    plus_x[0] = 1
    scales, signs = set(), set()
    torch.manual_seed(1)
    for _ in range(60):
        _, _, out_depth, out_normal = mtan_augment(image, label, flat_depth, plus_x)
        scales.add(round(3.0 / float(out_depth[0, 0, 0]), 4))
        signs.add(float(out_normal[0, 0, 0]))
    assert scales == {1.0, 1.2, 1.5} and signs == {1.0, -1.0}
