"""precision=fp16|bf16: autocast, grad scaler forms (mmcv Fp16OptimizerHook loss_scale), scaler state on resume."""

from __future__ import annotations

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mtl_bench.engine.builders import build
from mtl_bench.engine.precision import Precision
from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError

CPU = torch.device("cpu")


@pytest.fixture
def fp16(compose_cfg):
    """precision=fp16 with `loss_scale` in any of its forms, built from config as the engine builds it."""

    def make(loss_scale):
        node = compose_cfg("precision=fp16").precision
        node.loss_scale = loss_scale
        return build("precision", node, Precision, device=CPU)

    return make


def scalars(run_dir, tag):
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [e.value for e in events.Scalars(tag)]


@pytest.mark.parametrize(
    "loss_scale, scale, static",
    [
        ("dynamic", 65536.0, None),
        (512, 512.0, 512.0),  # an int is a valid static scale (the seed raised on it)
        (128.5, 128.5, 128.5),
        ({"init_scale": 1024, "growth_interval": 100}, 1024.0, None),
    ],
)
def test_loss_scale_forms(fp16, loss_scale, scale, static):
    precision = fp16(loss_scale)
    assert precision.name == "fp16"
    assert precision.scaler.get_scale() == scale and precision.static_scale == static
    if isinstance(loss_scale, dict):
        assert precision.scaler.get_growth_interval() == 100


@pytest.mark.parametrize(
    "loss_scale, message",
    [
        ("auto", r"^precision\.loss_scale: must be dynamic, a number > 0 .*, got 'auto'$"),
        (-1, r"^precision\.loss_scale: must be dynamic, a number > 0 .*, got -1$"),
        ({"init": 2.0}, r"^precision\.loss_scale\.init: no such key; allowed: init_scale"),
        ({"init_scale": 0}, r"^precision\.loss_scale\.init_scale: must be a number > 0, got 0$"),
    ],
)
def test_bad_loss_scale_is_one_line(fp16, loss_scale, message):
    with pytest.raises(ConfigError, match=message) as err:
        fp16(loss_scale)
    assert "\n" not in str(err.value)


def test_static_scale_holds_after_a_skipped_step():
    precision = Precision(CPU, dtype="float16", loss_scale=8)
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    precision.scaler.scale((p * float("inf")).sum()).backward()
    precision.scaler.step(opt)
    assert precision.found_inf(opt).item() == 1.0
    precision.update()
    assert precision.scaler.get_scale() == 8.0 and torch.equal(p, torch.ones(2))  # skipped, scale unchanged


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_low_precision_trains_close_to_fp32(small_conf, tmp_path, precision):
    reference = train(small_conf("optim.lr=0.003"), tmp_path / "fp32")
    low = train(small_conf("optim.lr=0.003", f"precision={precision}"), tmp_path / precision)
    initial = sum(v["loss"] for v in low.initial_test.values())
    final = sum(v["loss"] for v in low.test.values())
    assert final < initial
    assert final == pytest.approx(sum(v["loss"] for v in reference.test.values()), rel=0.05)


def test_fp16_logs_the_scale_and_skipped_steps_and_checkpoints_the_scaler(small_conf, tmp_path):
    init = {"init_scale": 2.0**40, "growth_interval": 1000}  # far too large: the first steps overflow
    train(
        small_conf("precision=fp16", f"precision.loss_scale={{init_scale:{init['init_scale']},growth_interval:1000}}"),
        tmp_path,
    )
    skipped = scalars(tmp_path, "steps/skipped")
    loss_scale = scalars(tmp_path, "amp/loss_scale")
    assert skipped[-1] >= 1 and loss_scale[0] < 2.0**40  # it skipped and backed off
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert state["grad_scaler"]["scale"] == pytest.approx(2.0**40 * 0.5 ** skipped[-1])
    assert state["skipped_steps"].item() == skipped[-1]


def test_resume_restores_the_grad_scaler(small_conf, tmp_path):
    full = train(small_conf("precision=fp16", "trainer.max_steps=20"), tmp_path / "full")
    train(small_conf("precision=fp16", "trainer.max_steps=10"), tmp_path / "part")
    resumed = train(small_conf("precision=fp16", "trainer.max_steps=20", "trainer.resume=auto"), tmp_path / "part")
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "part" / "checkpoints" / "last.pt", weights_only=True)
    assert a["grad_scaler"] == b["grad_scaler"]
    assert resumed.test == full.test
