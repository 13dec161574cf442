"""Training-step throughput of fp32, bf16 and fp16 on the default models, measured in one run.

    python scripts/bench_precision.py [--steps 200] [--threads 2] [--device auto]

For each experiment (toy + mlp, the default; digits + lenet) it times the trainer's own optimizer step
(forwards, balancer backward, non-finite checks, grad scaler for fp16, optimizer) and prints steps/s with
the ratio to fp32 in the same run. A first row per experiment, "fp32, bare loop", is a hand-written step
without the trainer's non-finite checks: it shows what they cost.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mtl_bench.analysis.machine import machine_description
from mtl_bench.catalog import conf_root
from mtl_bench.engine.builders import build_balancer, build_model, build_taskset, pick_device
from mtl_bench.engine.precision import build_precision
from mtl_bench.engine.progress import use_bar
from mtl_bench.engine.trainer import Trainer
from mtl_bench.optim import build_optimizer, build_param_groups, build_scheduler

EXPERIMENTS = {"toy + mlp (default)": [], "digits + lenet": ["experiment=digits_lenet"]}


def make_trainer(overrides: list[str], device: torch.device, run_dir: Path) -> Trainer:
    with initialize_config_dir(str(conf_root()), version_base="1.3"):
        conf = OmegaConf.to_object(compose("config", overrides=overrides))
    torch.manual_seed(0)
    taskset = build_taskset(conf.tasks).to(device)
    model = build_model(conf.model, taskset).to(device)
    balancer = build_balancer(conf.balancer, taskset.tasks, model).to(device)
    optimizer = build_optimizer(conf.optim, build_param_groups(model, conf.optim.lr, None, conf.optim.paramwise))
    scheduler = build_scheduler(conf.optim.schedule, optimizer, 10**6)
    return Trainer(taskset=taskset, model=model, balancer=balancer, optimizer=optimizer, scheduler=scheduler,
                   conf=conf.trainer, seed=0, run_dir=run_dir, logger=None, bar=use_bar("log", False),
                   precision=build_precision(conf.precision, device))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_trainer(trainer: Trainer, steps: int, device: torch.device) -> float:
    for _ in range(10):  # warm-up: allocator, autocast caches
        trainer._optimizer_step(False)
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        trainer._optimizer_step(False)
        trainer.step += 1
    sync(device)
    return steps / (time.perf_counter() - start)


def time_plain(trainer: Trainer, steps: int, device: torch.device) -> float:
    """The step without the trainer's checks: zero_grad, forward, balancer backward, optimizer step."""
    runner, optimizer = trainer.runner, trainer.optimizer
    tasks = trainer.taskset.tasks

    def step(i: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        inputs, targets = runner._batch(runner.samplers[0], i)
        out = trainer.model(inputs)
        trainer.balancer.backward({t.name: t.loss(out.preds[t.name], targets[t.name]) for t in tasks}, out.shared)
        optimizer.step()

    for i in range(10):
        step(i)
    sync(device)
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    sync(device)
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)

    print(f"machine: {machine_description()}, Python {platform.python_version()}, device {device}, "
          f"{args.steps} timed steps each")
    print("| experiment | precision | steps/s | ratio to fp32 |")
    print("|---|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in EXPERIMENTS.items():
            plain = time_plain(make_trainer(overrides, device, Path(tmp)), args.steps, device)
            rows = [("fp32, bare loop", plain)]
            for precision in ("fp32", "bf16", "fp16"):
                trainer = make_trainer([*overrides, f"precision={precision}"], device, Path(tmp))
                rows.append((precision, time_trainer(trainer, args.steps, device)))
            base = rows[1][1]
            for label, rate in rows:
                print(f"| {name} | {label} | {rate:.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
