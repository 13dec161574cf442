"""The training loop: determinism, exact resume after SIGKILL, metrics.json, TensorBoard output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mtl_bench.engine.recipe import train
from mtl_bench.errors import ConfigError
from tests.helpers.cli import SMALL


def test_same_config_and_seed_give_identical_numbers(small_conf, tmp_path):
    a = train(small_conf("seed=3"), tmp_path / "a")
    b = train(small_conf("seed=3"), tmp_path / "b")
    c = train(small_conf("seed=4"), tmp_path / "c")
    assert a.test == b.test and a.val == b.val
    assert a.test != c.test


def test_metrics_json_has_final_metrics_and_loss_ratio_summary(small_conf, tmp_path):
    train(small_conf(), tmp_path, overrides=["optim=adam"], choices={"optim": "adam"})
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["step"] == 20
    assert metrics["overrides"] == ["optim=adam"]
    assert set(metrics["test"]) == {"t0", "t1"} and "mse" in metrics["test"]["t0"]
    assert metrics["higher_is_better"]["t0"] == {"loss": False, "mse": False}
    expected = sum(metrics["test"][t]["loss"] / metrics["initial_test"][t]["loss"] for t in ("t0", "t1"))
    assert metrics["summary"]["test_loss_ratio_sum"] == pytest.approx(expected)
    assert metrics["wall_time_s"] > 0


def test_tensorboard_tags_layout_and_hparams_in_the_runs_own_file(small_conf, tmp_path):
    train(small_conf(), tmp_path, choices={"balancer": "fixed"})
    assert not [p for p in tmp_path.iterdir() if p.is_dir() and p.name not in ("checkpoints",)]  # no sub-runs
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in (
        "loss/t0",
        "loss/t1",
        "weight/t0",
        "weight/t1",
        "metric/val/t0/mse",
        "metric/test/t1/loss",
        "lr/default",
        "perf/steps_per_s",
        "summary/test_loss_ratio_sum",
    ):
        assert tag in tags, tag
    assert [e.step for e in events.Scalars("loss/t0")] == [5, 10, 15, 20]
    plugins = events.PluginTagToContent("hparams")
    assert "_hparams_/experiment" in plugins and "_hparams_/session_start_info" in plugins
    assert b"balancer" in plugins["_hparams_/session_start_info"]
    assert events.PluginTagToContent("custom_scalars")


def test_resume_auto_without_checkpoint_starts_fresh_and_says_so(small_conf, tmp_path, caplog):
    with caplog.at_level("INFO", logger="mtl_bench"):
        assert train(small_conf("trainer.resume=auto"), tmp_path / "run").step == 20
    said = [r for r in caplog.records if "trainer.resume=auto: no checkpoint in" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING" and "starts at step 0" in said[0].getMessage()
    caplog.clear()
    with caplog.at_level("INFO", logger="mtl_bench"):  # a resumed run says from which step
        train(small_conf("trainer.resume=auto", "trainer.max_steps=30"), tmp_path / "run")
    assert any(
        f"resumed from {tmp_path / 'run'}" in r.getMessage() and "at step 20" in r.getMessage() for r in caplog.records
    )


def test_resume_from_a_checkpoint_of_another_model_is_a_config_error(small_conf, tmp_path):
    train(small_conf(), tmp_path / "a")
    with pytest.raises(ConfigError, match=r"was trained with another config \(model.widths \[32, 32\] -> \[16\]\)"):
        train(small_conf("model.widths=[16]", f"trainer.resume={tmp_path / 'a'}"), tmp_path / "b")


def test_a_checkpoint_from_before_an_option_existed_resumes_at_its_default(small_conf, tmp_path):
    """An option added by a later version is absent from an older checkpoint's config: at its default it trains
    what the older version trained, so the run resumes; set to anything else, it is another config."""
    train(small_conf("trainer.max_steps=10"), tmp_path / "a")
    path = tmp_path / "a" / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=False)
    older = OmegaConf.create(state["config"])
    del older.trainer["validation_source"]
    state["config"] = OmegaConf.to_yaml(older)
    torch.save(state, path)
    assert train(small_conf("trainer.max_steps=20", f"trainer.resume={path}"), tmp_path / "b").step == 20
    with pytest.raises(ConfigError, match=r"another config \(trainer.validation_source \(unset\) -> val\)"):
        train(
            small_conf("trainer.max_steps=20", "trainer.validation_source=val", f"trainer.resume={path}"),
            tmp_path / "c",
        )


def test_missing_resume_path_is_a_config_error(small_conf, tmp_path):
    with pytest.raises(ConfigError, match="trainer.resume="):
        train(small_conf(f"trainer.resume={tmp_path / 'nowhere'}"), tmp_path / "run")


def test_epochs_set_the_step_count(small_conf, tmp_path):
    # 512 samples / batch 32 = 16 steps per epoch
    assert train(small_conf("trainer.epochs=2"), tmp_path).step == 32


def _train_cmd(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mtl_bench",
        "train",
        f"hydra.run.dir={run_dir}",
        *SMALL,
        "trainer.max_steps=600",  # the kill lands within ~10 ms of step 50's checkpoint, far from the end
        "trainer.checkpoint_every=50",
        "trainer.eval_every=1000",
        "trainer.log_every=100",
        "trainer.num_threads=1",
        *extra,
    ]


def test_run_killed_with_sigkill_and_resumed_ends_with_identical_metrics(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(_train_cmd(tmp_path / "straight"), check=True, env=env, capture_output=True, timeout=300)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train_cmd(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = killed / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "metrics.json").exists()  # it really died mid-run

    subprocess.run(_train_cmd(killed, "trainer.resume=auto"), check=True, env=env, capture_output=True, timeout=300)
    straight = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    resumed = json.loads((killed / "metrics.json").read_text())
    assert resumed["step"] == straight["step"] == 600
    assert resumed["test"] == straight["test"] and resumed["val"] == straight["val"]
    assert resumed["summary"] == straight["summary"]


def test_loop_reads_device_values_only_at_log_and_eval_points(small_conf, tmp_path, monkeypatch):
    """Host syncs from our code (item/tolist/bool/float of a tensor) happen per log interval, not per step."""
    import torch

    calls = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("mtl_bench"):
                calls.append((caller, _name))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    train(small_conf("trainer.max_steps=40", "trainer.log_every=20", "trainer.eval_every=1000"), tmp_path)
    # 2 log points + 3 evaluations (initial test for L_i(0), final val, final test), one transfer each
    assert len(calls) == 5, calls


@pytest.mark.parametrize("balancer", ["rescaled_norm", "gradnorm"])
def test_balancer_state_is_logged_and_checkpointed(small_conf, tmp_path, balancer):
    import torch

    train(small_conf(f"balancer={balancer}"), tmp_path)
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"weight/t0", "grad_norm/t0"}
    if balancer == "gradnorm":
        expected |= {"gradnorm/norm_share/t1", "gradnorm/target/t0", "gradnorm/loss_ratio/t1", "gradnorm/L_grad"}
    else:
        expected |= {"ratio/t1"}
    assert expected <= tags
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["balancer"]
    if balancer == "gradnorm":  # the weights moved and still sum to T
        assert state["weights"].sum().item() == pytest.approx(2.0) and not torch.equal(state["weights"], torch.ones(2))
    else:  # 20 steps of EMA count: sum_{k<20} 0.999^k
        assert state["ema_count"][0].item() == pytest.approx((1 - 0.999**20) / (1 - 0.999), rel=1e-5)


def test_grad_norm_total_and_momentum_are_logged_and_clipping_applies(small_conf, tmp_path):
    train(small_conf("optim=sgd", "trainer.grad_clip.max_norm=0.001"), tmp_path)
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    norms = [e.value for e in events.Scalars("grad_norm/total")]
    assert [e.step for e in events.Scalars("grad_norm/total")] == [5, 10, 15, 20]
    assert all(n > 0.001 for n in norms)  # measured before clipping
    assert "momentum/default" not in events.Tags()["scalars"]  # constant: only a schedule that moves it logs it


def test_momentum_is_logged_where_the_schedule_moves_it(small_conf, tmp_path):
    train(small_conf("optim=adam", "optim/schedule=cyclic"), tmp_path)
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    betas = [e.value for e in events.Scalars("momentum/default")]
    assert len(betas) == 4 and len(set(betas)) > 1 and max(betas) <= 0.9 + 1e-6  # beta1 0.9 at most, moving


def test_unused_parameters_are_named_once(small_conf, tmp_path, caplog, monkeypatch):
    import torch

    from mtl_bench.engine import compose

    build = compose.build

    def with_unused_layer(key, *args, **kwargs):
        part = build(key, *args, **kwargs)
        if key == "model":
            part.spare = torch.nn.Linear(2, 2)  # never called in forward
        return part

    monkeypatch.setattr("mtl_bench.engine.compose.build", with_unused_layer)
    with caplog.at_level("WARNING", logger="mtl_bench"):
        train(small_conf("trainer.detect_anomalous_params=true"), tmp_path)
    warnings = [r.getMessage() for r in caplog.records if "do not reach the loss" in r.getMessage()]
    assert warnings == ["trainable parameters that do not reach the loss: spare.weight, spare.bias"]


@pytest.mark.parametrize("optim", ["scaled_adam", "sgd"])
def test_training_lowers_the_loss_with_each_optimizer(small_conf, tmp_path, optim):
    result = train(small_conf(f"optim={optim}", "trainer.max_steps=60"), tmp_path)
    initial = sum(v["loss"] for v in result.initial_test.values())
    assert sum(v["loss"] for v in result.test.values()) < initial


def test_eden_counts_epochs(small_conf, tmp_path):
    # 512 samples, batch 32: 16 steps per epoch, so 20 steps end with epoch count 1 and batch count 20
    train(small_conf("optim=scaled_adam"), tmp_path)
    import torch

    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["scheduler"]
    assert state["batch"] == 20 and state["epoch"] == 1


def test_profile_writes_a_tensorboard_trace(small_conf, tmp_path):
    train(small_conf("trainer.profile=true"), tmp_path)
    traces = list((tmp_path / "profile").glob("*.pt.trace.json"))
    assert len(traces) == 1 and "ProfilerStep" in traces[0].read_text()


def test_run_files_follow_the_umask(small_conf, tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        train(small_conf(), tmp_path)
    finally:
        os.umask(old)
    for name in ("metrics.json", "checkpoints/last.pt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
