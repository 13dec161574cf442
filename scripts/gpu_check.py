"""The GPU acceptance check: one command, within 8 minutes on one GPU, that exits non-zero on any failure and writes
docs/gpu.md (the card, torch and CUDA versions, the date, every section's numbers).

    python scripts/gpu_check.py                          # CUDA: every section in full, docs/gpu.md
    python scripts/gpu_check.py --device cpu             # the reduced form CI runs (tests/benchmarks/test_gpu_check.py)
                                                         # writes outputs/gpu_check_cpu.md unless --output says
    python scripts/gpu_check.py --only balancers,ddp     # some sections ( --reduced: the small sizes on CUDA too)

Sections (each one's failures are listed and the others still run):
- balancers: every balancer option, 20 steps on tasks=toy10 in fp32, fp16 (GradScaler) and bf16: losses finite,
  `weight/<task>` measured for every task at the log steps (10, 20) and finite; and fp32 after one step (optim=sgd,
  TF32 off) equal to the same run on the CPU: parameters within rtol 1e-4, atol 1e-6.
- bench: time per step and peak memory per step (CUDA: torch.cuda.max_memory_allocated above the level before the
  step) at T=10 on the zoo benchmark's model (HPS 250 -> 4x512, scalar heads, batch 256), each method against the
  fixed step, the floor, torchjd 0.18 and LibMTL 1.1.5 in the same run (scripts/bench_balancers.py's machinery),
  and the loss-level methods against the fixed step.
- compile: trainer.compile=true against false for the default run (balancer=fixed) and a gradient method
  (balancer=upgrad): the first step (the compile), ms per step after it, and the losses after the same steps.
- qm9: model=mpnn at batch 120 on a small tasks.limit: the engine's step against nash-mtl's `Net`
  (benchmarks/nash_mtl_net.py, the same parameters and batch), and the data path (collation, pinning and the
  copy to the device) as a share of the engine's step. Needs the chem extra (QM9 from qm9pack: docs/qm9.md).
- segnet: one SegNet-MTAN step on a generated NYUv2-shaped tree (288x384) with each of fixed, nash_mtl, famo.
- ddp: DistributedDataParallel with NCCL on every GPU present (one process if there is one; gloo on the CPU with
  two) and a gradient method (UPGrad, whose Gramian is averaged over the ranks): the ranks end equal, and equal to
  one process on the whole batch.

The reduced form (--device cpu, or --reduced) runs every section at small sizes: a few balancers, three steps, T=3,
one compiled run, 300 molecules at batch 16, SegNet-MTAN with filters [8, 16, 32, 64, 64], two gloo ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.runs import hps_mlp, recipe
from benchmarks.timing import interleaved, markdown_table, medians, seconds_per_call, sync
from mtl_bench.analysis.machine import machine_description
from mtl_bench.catalog import config_options

REPO = Path(__file__).resolve().parent.parent
SECTIONS = ("balancers", "bench", "compile", "qm9", "segnet", "ddp")
BUDGET_S = 480  # the full form's limit on one GPU
# As tests/balancers/test_zoo.py: MoDo and SDMGrad draw on micro-batches; the bilevel methods need a validation split.
EXTRA = {"modo": ["trainer.grad_accumulation_steps=3"], "sdmgrad": ["trainer.grad_accumulation_steps=3"]}
EXTRA["auto_lambda"] = EXTRA["moml"] = EXTRA["forum"] = ["trainer.validation_holdout=0.2"]
REDUCED_BALANCERS = ["fixed", "famo", "upgrad", "nash_mtl", "gradnorm"]
PRECISIONS = ("fp32", "fp16", "bf16")
CPU_MATCH = {"rtol": 1e-4, "atol": 1e-6}  # fp32 parameters after one SGD step, the device against the CPU


@dataclass
class Section:
    title: str
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def fail(self, message: str) -> None:
        self.failures.append(message)
        print(f"FAIL {self.title}: {message}", flush=True)


@dataclass
class Check:
    device: torch.device
    reduced: bool
    root: Path

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def run_dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def device_override(device: torch.device) -> str:
    return f"trainer.device={device}"


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """float32 matmuls and convolutions without TF32, so a CUDA run can be held to the CPU's numbers."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


# ---------------------------------------------------------------------------------------------- balancers


def toy10(balancer: str, device: torch.device, *extra: str) -> list[str]:
    return [
        f"balancer={balancer}",
        "tasks=toy10",
        "tasks.n_train=640",
        "tasks.n_val=32",
        "tasks.n_test=32",
        "model.widths=[32,32]",
        "trainer=smoke",
        "trainer.batch_size=32",
        "trainer.num_threads=1",
        device_override(device),
        *EXTRA.get(balancer, []),
        *extra,
    ]


@dataclass
class Trained:
    finite: bool
    weights: list[dict[str, float]]  # the measured weight/<task> at each log step
    params: list[torch.Tensor]
    tasks: list[str]
    ms_per_step: float


def train_steps(overrides: list[str], run_dir: Path, steps: int, log_every: int) -> Trained:
    """`steps` optimizer steps as the loop takes them (measuring at every `log_every`-th); one host read at the end."""
    with recipe(overrides, run_dir) as run:
        finite = torch.ones((), dtype=torch.bool, device=run.device)
        logged: list[dict[str, torch.Tensor]] = []
        sync(run.device)
        start = time.perf_counter()
        for step in range(steps):
            measuring = (step + 1) % log_every == 0
            result = run.optimizer_step(measuring)
            run.step += 1
            finite &= torch.isfinite(result.losses).all()
            if measuring:
                logged.append(
                    {k: v.detach().float() for k, v in result.measurements.items() if k.startswith("weight/")}
                )
        sync(run.device)
        elapsed = time.perf_counter() - start
        return Trained(
            bool(finite),
            [{k: float(v) for k, v in m.items()} for m in logged],
            [p.detach().cpu().clone() for p in run.model.parameters()],
            list(run.taskset.task_names),
            1e3 * elapsed / steps,
        )


def weights_problem(trained: Trained) -> str:
    """'' when every log step measured a finite weight/<task> for every task, else what is missing."""
    for i, measured in enumerate(trained.weights):
        missing = [t for t in trained.tasks if f"weight/{t}" not in measured]
        if missing:
            return f"log step {i + 1}: no weight/ for {missing[:3]}"
        bad = [k for k, v in measured.items() if not np.isfinite(v)]
        if bad:
            return f"log step {i + 1}: non-finite {bad[:3]}"
    return "" if trained.weights else "nothing measured"


def check_balancers(check: Check, section: Section) -> None:
    names = REDUCED_BALANCERS if check.reduced else config_options()["balancer"]
    steps, log_every = (4, 2) if check.reduced else (20, 10)
    cpu = torch.device("cpu")
    rows = []
    for name in names:
        cells = [f"`{name}`"]
        for precision in PRECISIONS:
            try:
                trained = train_steps(
                    toy10(name, check.device, f"precision={precision}"),
                    check.run_dir(f"bal-{name}-{precision}"),
                    steps,
                    log_every,
                )
                problem = ("non-finite loss; " if not trained.finite else "") + weights_problem(trained)
                cells.append(f"{trained.ms_per_step:.1f}" if not problem else "FAIL")
                if problem:
                    section.fail(f"{name} {precision}: {problem}")
            except Exception as err:  # one method's failure must not hide the others'
                cells.append("FAIL")
                section.fail(f"{name} {precision}: {one_line(err)}")
        try:
            with exact_fp32():
                here, there = (
                    train_steps(toy10(name, d, "optim=sgd"), check.run_dir(f"bal-{name}-one-{i}"), 1, 1)
                    for i, d in enumerate((check.device, cpu))
                )
            worst = max(float((a - b).abs().max()) for a, b in zip(here.params, there.params))
            close = all(torch.allclose(a, b, **CPU_MATCH) for a, b in zip(here.params, there.params))
            cells.append(f"{worst:.1e}" if close else f"FAIL {worst:.1e}")
            if not close:
                section.fail(f"{name}: fp32 parameters after one step differ from the CPU's by {worst:.2e}")
        except Exception as err:
            cells.append("FAIL")
            section.fail(f"{name} fp32 against the CPU: {one_line(err)}")
        rows.append(cells)
        print(f"balancers: {' | '.join(cells)}", flush=True)
    section.lines += [
        f"{len(names)} balancer options, {steps} steps each on tasks=toy10 (model.widths=[32,32], batch 32) per "
        f"precision: ms per step over the {steps} steps (measuring every {log_every} steps; setup excluded) where the "
        "losses stayed finite and every task's `weight/<task>` was measured and finite at each log step, else FAIL. "
        f"Last column: the largest parameter difference after one fp32 SGD step (TF32 off) against the same run on "
        f"the CPU; it must be within rtol {CPU_MATCH['rtol']:g}, atol {CPU_MATCH['atol']:g}.",
        "",
        markdown_table(["balancer", *(f"{p} ms/step" for p in PRECISIONS), "max abs diff vs CPU"], rows),
    ]


# ---------------------------------------------------------------------------------------------- bench


def check_bench(check: Check, section: Section) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_balancers as bb

    import mtl_bench.balancers as balancers

    tasks, rounds, steps = (3, 1, 1) if check.reduced else (10, 3, 2)
    only = ["upgrad", "pcgrad", "nash_mtl"] if check.reduced else None
    started = time.perf_counter()
    rows = bb.bench_peers([tasks], rounds, steps, check.device, True, only)
    cell = lambda v: "" if v is None else f"{v:.2f}"  # noqa: E731
    section.lines += [
        f"HPS 250 -> 4x512, {tasks} scalar heads, batch 256; {rounds} interleaved rounds x {steps} steps, medians "
        f"({time.perf_counter() - started:.0f} s). Peak MB: allocated during one step above the level before it.",
        "",
        markdown_table(
            ["method", "variant", "ms/step", "x fixed", "x floor", "x torchjd", "x LibMTL", "peak MB/step"],
            [
                [r["method"], r["variant"], f"{r['ms']:.2f}", f"{r['x_fixed']:.2f}", f"{r['x_floor']:.2f}"]
                + [cell(r["x_torchjd"]), cell(r["x_libmtl"]), f"{r['mb']:.1f}"]
                for r in rows
            ],
        ),
    ]
    bad = [f"{r['method']} {r['variant']}" for r in rows if not np.isfinite(r["ms"]) or r["ms"] <= 0]
    if bad:
        section.fail(f"no time for {bad}")
    levels = ["FAMO", "UncertaintyWeighting"] if check.reduced else bb.LOSS_LEVEL
    variants: dict[str, Callable] = {"fixed": bb.VARIANTS["fixed"]}
    if not check.reduced:
        variants |= {k: v for k, v in bb.VARIANTS.items() if not k.startswith("encodec")}
    for cls_name in levels:
        variants[cls_name] = lambda model, names, c=getattr(balancers, cls_name): c(names)
    torch.manual_seed(0)
    model = hps_mlp(512, 4, tasks, 1)
    level_rows = bb.bench_config("wide MLP 4x512", model, 256, 1, variants, rounds, steps, check.device)
    section.lines += [
        "",
        "Loss-level and last-layer methods on the same model, against the fixed step:",
        "",
        markdown_table(
            ["balancer", "ms/step", "x fixed", "peak MB/step", "x fixed"],
            [
                [r["balancer"], f"{r['ms']:.2f}", f"{r['x_time']:.2f}", f"{r['mb']:.1f}", f"{r['x_mem']:.2f}"]
                for r in level_rows
            ],
        ),
    ]


# ---------------------------------------------------------------------------------------------- compile


def check_compile(check: Check, section: Section) -> None:
    cases = [("fixed", "false"), ("fixed", "true")]
    if not check.reduced:
        cases += [("upgrad", "false"), ("upgrad", "true")]
    steps = 3 if check.reduced else 20
    rows, losses = [], {}
    for balancer, compiled in cases:
        overrides = [
            f"balancer={balancer}",
            f"trainer.compile={compiled}",
            "trainer=smoke",
            "trainer.num_threads=1",
            device_override(check.device),
        ]
        with recipe(overrides, check.run_dir(f"compile-{balancer}-{compiled}")) as run:
            sync(run.device)
            start = time.perf_counter()
            run.optimizer_step(False)  # the compile happens here
            run.step += 1
            sync(run.device)
            first = time.perf_counter() - start

            def step(run: Any = run) -> None:
                run.optimizer_step(False)
                run.step += 1

            per_step = seconds_per_call(step, steps, check.device)
            result = run.optimizer_step(True)
            losses[(balancer, compiled)] = result.losses.detach().float().cpu()
            how = run.implementations.get("trainer.compile", "")
        rows.append([balancer, compiled, how, f"{first:.2f}", f"{1e3 * per_step:.2f}"])
        print(f"compile: {rows[-1]}", flush=True)
    for balancer in {b for b, _ in cases}:
        eager, compiled = losses[(balancer, "false")], losses.get((balancer, "true"))
        if compiled is None:
            continue
        if not torch.isfinite(compiled).all() or not torch.allclose(eager, compiled, rtol=1e-3, atol=1e-5):
            section.fail(f"{balancer}: compiled losses {compiled.tolist()} against eager {eager.tolist()}")
    section.lines += [
        f"The default run (tasks=toy, model=mlp) with trainer=smoke; first step (s, the compile included), then ms per "
        f"step over {steps} steps. The losses after the same steps must agree within rtol 1e-3.",
        "",
        markdown_table(["balancer", "trainer.compile", "implementation", "first step s", "ms/step"], rows),
    ]


# ---------------------------------------------------------------------------------------------- qm9


def check_qm9(check: Check, section: Section) -> None:
    from mtl_bench.tasks.qm9_molecules import qm9pack_files, require_chem

    try:
        require_chem()
        qm9pack_files()
    except ImportError as err:  # a one-line message naming the extra
        section.fail(str(err))
        return
    from benchmarks.nash_mtl_net import ReferenceNet
    from mtl_bench.engine.data import to_device
    from mtl_bench.models.mpnn import MPNN

    limit, held, batch, steps, rounds = (300, 50, 16, 2, 1) if check.reduced else (3000, 500, 120, 10, 3)
    overrides = [
        "tasks=qm9",
        "model=mpnn",
        f"tasks.limit={limit}",
        f"tasks.n_val={held}",
        f"tasks.n_test={held}",
        f"trainer.batch_size={batch}",
        "trainer=smoke",
        "trainer.num_threads=1",
        "balancer=fixed",
        device_override(check.device),
    ]
    device = check.device
    with recipe(overrides, check.run_dir("qm9")) as run:

        def engine_step() -> None:
            run.optimizer_step(False)
            run.step += 1

        engine_step()  # warm-up (allocator, cuDNN's choices)
        split, names = run.taskset.train, list(run.taskset.task_names)
        items = [split[i] for i in range(batch)]
        data, targets = split.collate(items)

        def collate() -> None:
            split.collate([split[i] for i in range(batch)])

        def transfer() -> None:
            inputs, ys = data, targets
            if device.type == "cuda":  # as the DataLoader hands a batch over with pin_memory on CUDA
                inputs, ys = inputs.pin_memory(), {k: v.pin_memory() for k, v in ys.items()}
            to_device(inputs, ys, device)

        data_dev = data.to(device)
        y = torch.cat([targets[n] for n in names], 1).to(device)
        torch.manual_seed(0)
        ref = ReferenceNet(len(names)).to(device)
        ours = MPNN((11,), {n: 1 for n in names}).to(device)
        state = {f"trunk.{k}": v for k, v in ref.state_dict().items() if not k.startswith("task_specific")}
        for i, n in enumerate(names):
            state |= {f"heads.{n}.{p}": getattr(ref.task_specific[i], p) for p in ("weight", "bias")}
        ours.load_state_dict(state)
        opt_ref, opt_ours = (torch.optim.Adam(m.parameters(), lr=1e-3) for m in (ref, ours))

        def ref_step() -> None:
            opt_ref.zero_grad()
            F.mse_loss(ref(data_dev)[0], y, reduction="none").mean(0).sum().backward()
            opt_ref.step()

        def our_step() -> None:
            opt_ours.zero_grad()
            preds = ours(data_dev).preds
            torch.stack([F.mse_loss(preds[n], y[:, i : i + 1]) for i, n in enumerate(names)]).sum().backward()
            opt_ours.step()

        ref_step(), our_step()  # warm-up
        timers = {
            "engine step (model=mpnn, data path included)": lambda: seconds_per_call(engine_step, steps, device),
            "mtl-bench MPNN, model step only": lambda: seconds_per_call(our_step, steps, device),
            "nash-mtl Net, model step only": lambda: seconds_per_call(ref_step, steps, device),
            "collation": lambda: seconds_per_call(collate, steps),
            "pin + copy to the device": lambda: seconds_per_call(transfer, steps, device),
        }
        t = medians(interleaved(timers, rounds))
    engine = t["engine step (model=mpnn, data path included)"]
    data_path = t["collation"] + t["pin + copy to the device"]
    ratio = t["mtl-bench MPNN, model step only"] / t["nash-mtl Net, model step only"]
    section.lines += [
        f"tasks=qm9 tasks.limit={limit}, batch {batch} ({data.num_nodes} nodes, {data.num_edges} edges in the timed "
        f"batch); {rounds} interleaved rounds x {steps} calls, medians. Model steps: forward, the 11 MSE losses, "
        "backward, Adam, on the same parameters and batch.",
        "",
        markdown_table(["what", "ms"], [[k, f"{1e3 * v:.2f}"] for k, v in t.items()]),
        "",
        f"MPNN / nash-mtl Net: {ratio:.2f}x. Data path (collation + pin + copy) / engine step: "
        f"{100 * data_path / engine:.0f}%.",
    ]
    if not all(np.isfinite(v) and v > 0 for v in t.values()):
        section.fail(f"a timing is not positive: {t}")


# ---------------------------------------------------------------------------------------------- segnet


def write_nyuv2(root: Path, n_train: int = 4, n_val: int = 2) -> Path:
    """A NYUv2 tree in MTAN's layout at 288x384 (random values, the real shapes and dtypes)."""
    rng = np.random.default_rng(0)
    h, w = 288, 384
    for split, n in (("train", n_train), ("val", n_val)):
        for i in range(n):
            normal = rng.normal(size=(h, w, 3))
            arrays = {
                "image": rng.random((h, w, 3)),
                "label": rng.integers(-1, 13, (h, w)),
                "depth": rng.uniform(0.5, 8.0, (h, w, 1)),
                "normal": normal / np.linalg.norm(normal, axis=-1, keepdims=True),
            }
            for folder, array in arrays.items():
                (root / split / folder).mkdir(parents=True, exist_ok=True)
                np.save(root / split / folder / f"{i}.npy", array.astype(np.float32))
    return root


def check_segnet(check: Check, section: Section) -> None:
    root = write_nyuv2(check.run_dir("nyuv2"))
    # The reduced form narrows the network (the reference's filters are [64, 128, 256, 512, 512]): 6 GB on a CPU.
    narrow = ["model.filters=[8,16,32,64,64]"] if check.reduced else []
    rows = []
    for method in ("fixed", "nash_mtl", "famo"):
        overrides = [
            *narrow,
            "experiment=nyuv2_segnet_mtan",
            f"tasks.root={root}",
            "trainer=smoke",
            "trainer.batch_size=2",
            "trainer.num_threads=1",
            f"balancer={method}",
            device_override(check.device),
        ]
        try:
            with recipe(overrides, check.run_dir(f"segnet-{method}")) as run:
                if check.cuda:
                    torch.cuda.reset_peak_memory_stats(check.device)
                sync(run.device)
                start = time.perf_counter()
                result = run.optimizer_step(True)
                sync(run.device)
                seconds = time.perf_counter() - start
                losses = result.losses.detach().float().cpu()
                weights = {k: float(v) for k, v in result.measurements.items() if k.startswith("weight/")}
                tasks = list(run.taskset.task_names)
            peak = torch.cuda.max_memory_allocated(check.device) / 2**20 if check.cuda else float("nan")
            ok = bool(torch.isfinite(losses).all()) and all(
                np.isfinite(weights.get(f"weight/{t}", np.nan)) for t in tasks
            )
            rows.append([method, ", ".join(f"{v:.3f}" for v in losses.tolist()), f"{seconds:.2f}", f"{peak:.0f}"])
            if not ok:
                section.fail(f"{method}: losses {losses.tolist()}, weights {weights}")
        except Exception as err:
            rows.append([method, "FAIL", "", ""])
            section.fail(f"{method}: {one_line(err)}")
    section.lines += [
        f"experiment=nyuv2_segnet_mtan {' '.join(narrow)} (batch 2, augmentation on) on a generated 288x384 tree of "
        "4 training images; "
        "the first step of each method (its first-call costs included), losses finite and every task's weight "
        "measured. Peak MB: torch.cuda.max_memory_allocated over the step (CUDA only).",
        "",
        markdown_table(["balancer", "losses", "first step s", "peak MB"], rows),
    ]


# ---------------------------------------------------------------------------------------------- ddp

DDP_TASKS, DDP_STEPS, DDP_BATCH = 3, 3, 8


def ddp_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(DDP_STEPS, DDP_BATCH, 8, generator=g), torch.randn(DDP_STEPS, DDP_BATCH, DDP_TASKS, generator=g)


def ddp_train(device: torch.device, rows: slice, wrap: Callable[[torch.nn.Module], torch.nn.Module]) -> list:
    """UPGrad on a small HPS model, this rank on `rows` of every batch; the parameters at the end."""
    from mtl_bench.balancers import BackwardContext, UPGrad

    torch.manual_seed(0)
    model = hps_mlp(64, 2, DDP_TASKS, 1, input_dim=8).to(device)
    forward = wrap(model)
    names = list(model.heads)
    balancer = UPGrad(names, list(model.shared_parameters())).to(device)
    opt = torch.optim.SGD(forward.parameters(), lr=0.05)
    xs, ys = ddp_data()
    for step in range(DDP_STEPS):
        opt.zero_grad()
        x, y = xs[step, rows].to(device), ys[step, rows].to(device)
        out = forward(x)
        losses = {n: F.mse_loss(out.preds[n], y[:, i : i + 1]) for i, n in enumerate(names)}
        balancer.backward(losses, out.shared, BackwardContext())
        opt.step()
        balancer.step()
    return [p.detach().cpu() for p in model.parameters()]


def ddp_worker(rank: int, world: int, init_file: str, out_dir: str, device_type: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    cuda = device_type == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        wrap = lambda m: DistributedDataParallel(m, device_ids=[rank] if cuda else None)  # noqa: E731
        with exact_fp32():
            own = ddp_train(device, slice(rank * DDP_BATCH // world, (rank + 1) * DDP_BATCH // world), wrap)
            whole = ddp_train(device, slice(None), wrap)
        torch.save({"own": own, "whole": whole}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def check_ddp(check: Check, section: Section) -> None:
    import torch.multiprocessing as mp

    world = torch.cuda.device_count() if check.cuda else 2
    out = check.run_dir("ddp")
    with exact_fp32():
        alone = ddp_train(check.device, slice(None), lambda m: m)
    context = mp.spawn(
        ddp_worker, args=(world, str(out / "init"), str(out), check.device.type), nprocs=world, join=False
    )
    deadline = time.monotonic() + 180
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            section.fail(f"the {world} DDP processes did not finish in 180 s (a collective that never matched)")
            return
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(world)]
    same = all(torch.equal(a, b) for other in ranks[1:] for a, b in zip(ranks[0]["own"], other["own"]))
    worst = max(float((a - b).abs().max()) for a, b in zip(ranks[0]["whole"], alone))
    close = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(ranks[0]["whole"], alone))
    backend = "NCCL" if check.cuda else "gloo"
    section.lines += [
        f"{world} process(es), {backend}, DistributedDataParallel around a 2x64 HPS model with {DDP_TASKS} tasks, "
        f"balancer UPGrad, {DDP_STEPS} SGD steps of batch {DDP_BATCH}. Each rank on its own slice of every batch (the "
        f"Gramian averaged over the ranks before the solve, DDP averaging the direction): the ranks end with equal "
        f"parameters: {'yes' if same else 'NO'}. Every rank on the whole batch: the largest difference from one "
        f"process without DDP is {worst:.1e} (allowed: rtol 1e-5, atol 1e-6).",
    ]
    if not same:
        section.fail("the ranks ended with different parameters")
    if not close:
        section.fail(f"DDP on the whole batch differs from one process by {worst:.2e}")


# ---------------------------------------------------------------------------------------------- the report

CHECKS: dict[str, Callable[[Check, Section], None]] = {
    "balancers": check_balancers,
    "bench": check_bench,
    "compile": check_compile,
    "qm9": check_qm9,
    "segnet": check_segnet,
    "ddp": check_ddp,
}
TITLES = {
    "balancers": "Every balancer in fp32, fp16 and bf16; fp32 against the CPU",
    "bench": "Time and peak memory per step at T=10 against the fixed step, torchjd and LibMTL",
    "compile": "trainer.compile on and off",
    "qm9": "QM9: model=mpnn against nash-mtl's Net; the data path's share",
    "segnet": "SegNet-MTAN on NYUv2-shaped data",
    "ddp": "DDP with a gradient method",
}


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}"


def header(check: Check, started: datetime.datetime, total_s: float, failures: int) -> list[str]:
    if check.cuda:
        props = torch.cuda.get_device_properties(check.device)
        card = (
            f"{props.name} ({torch.cuda.device_count()} visible), {props.total_memory / 2**30:.0f} GiB, compute "
            f"capability {props.major}.{props.minor}"
        )
    else:
        card = "none: the reduced CPU form (--device cpu); the GPU form writes docs/gpu.md"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    form = "reduced" if check.reduced else "full"
    return [
        "# GPU check",
        "",
        f"Written by `python scripts/gpu_check.py` ({form} form, sections: see its docstring); do not edit by hand.",
        "",
        f"- date: {started:%Y-%m-%d %H:%M} UTC",
        f"- card: {card}",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, cuDNN {cudnn or 'none'}, "
        f"Python {platform.python_version()}",
        f"- host: {machine_description()}",
        f"- result: {'PASS' if not failures else f'FAIL ({failures} failures, listed under their sections)'}, "
        f"{total_s:.0f} s in all" + (f" (budget {BUDGET_S} s)" if not check.reduced else ""),
    ]


def default_output(device: torch.device) -> Path:
    """docs/gpu.md for the GPU form; the CPU form writes under outputs/ (git-ignored) unless --output names a file."""
    return REPO / "docs" / "gpu.md" if device.type == "cuda" else REPO / "outputs" / "gpu_check_cpu.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the full check) or cpu (the reduced form)")
    parser.add_argument("--output", default=None, help="the report (default: docs/gpu.md on CUDA, else outputs/)")
    parser.add_argument("--only", default=None, help=f"comma-separated sections of {', '.join(SECTIONS)}")
    parser.add_argument("--reduced", action="store_true", help="the small sizes on CUDA too")
    args = parser.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = torch.device("meta")
    if device.type not in ("cuda", "cpu"):
        parser.error(f"--device: {args.device!r} is not cuda, cuda:N or cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (--device cpu runs the reduced form)")
    only = SECTIONS if args.only is None else tuple(s.strip() for s in args.only.split(","))
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        parser.error(f"--only: unknown section(s) {unknown}; allowed: {', '.join(SECTIONS)}")
    output = Path(args.output) if args.output else default_output(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    started_at = datetime.datetime.now(datetime.timezone.utc)
    started = time.perf_counter()
    sections = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        check = Check(device, args.reduced or device.type == "cpu", Path(tmp))
        for name in only:
            section = Section(TITLES[name])
            t0 = time.perf_counter()
            print(f"== {name}", flush=True)
            try:
                CHECKS[name](check, section)
            except Exception as err:
                section.fail(one_line(err))
                traceback.print_exc()
            section.seconds = time.perf_counter() - t0
            sections.append(section)
    total = time.perf_counter() - started
    failures = sum(len(s.failures) for s in sections)
    if not check.reduced and set(only) == set(SECTIONS) and total > BUDGET_S:
        sections[-1].fail(f"the check took {total:.0f} s, over its {BUDGET_S} s budget")
        failures += 1
    lines = header(check, started_at, total, failures)
    for section in sections:
        lines += ["", f"## {section.title}", "", f"{section.seconds:.0f} s.", ""] + section.lines
        if section.failures:
            lines += ["", "Failures:", ""] + [f"- {f}" for f in section.failures]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(lines) + "\n")
    print(f"{'PASS' if not failures else f'FAIL ({failures})'} in {total:.0f} s; report: {output}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
