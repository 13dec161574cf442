"""Full training-step time and peak memory of each loss balancer relative to fixed weights, measured in one run.

    python scripts/bench_balancers.py [--rounds 5] [--steps 4] [--device cpu] [--threads 1]
        [--tasks 2,10,40] [--head-dims 100,1] [--generic] [--loss-level] [--measure]
    python scripts/bench_balancers.py --peers [--tasks 2,10] [--rounds 3] [--steps 3] [--methods pcgrad,mgda]
        [--measure]

--peers times the gradient methods against their references on identical copies of the HPS model
(250 -> 4x512 ReLU trunk, scalar heads, batch 256): ours with grad_source=shared_params (exact) and
shared_rep, torchjd 0.18 (mtl_backward + jac_to_grad) and LibMTL 1.1.5 (its weighting modules loaded from
the installed files); every ratio is to the fixed-weight step and to the floor of the same run. The floor
is one forward, then one backward per task through heads and trunk, accumulated into `.grad`: the least
work that yields T per-task gradients (what any exact gradient method must at least do). SDMGrad and MoDo take
three independent batches a step (the micro-batches of gradient accumulation): each of their variants, the fixed
step and the floor included, runs three micro-batches a step; their torchjd peer is its docstrings' recipe.

A step is what the trainer does between logging steps: zero_grad, forward, per-task MSE losses, the balancer's
backward (with the loop's context; --measure: a logging step's, with the balancer's measurements), an Adam
step (fused, as `optim=adam`), `balancer.step()`. Models: the GradNorm paper's toy MLP (input 250, four shared
ReLU layers of 100, T=10, batch 100) and a wider MLP (four shared layers of 512, batch 256) with T = 2, 10, 40
heads of each size in --head-dims (100: the toy task's targets; 1: scalar heads, where the balancer's own work is
the largest share of the step). Variants of one configuration run interleaved, round after round, and
each time is the median over rounds, so a background load that drifts hits all variants alike.
"encodec Balancer (peer)" is EnCodec's own Balancer (benchmarks/encodec_balancer.py, its public code
step for step; its heads get no gradient), the reference rescaled_norm is held to; "encodec Balancer + heads"
adds the heads' gradients, each head's loss scaled by EnCodec's factor, as one backward restricted to the heads:
the same gradients as rescaled_norm, so the same work for the optimizer.
Peak memory is the high-water mark, during one step, of the memory allocated in that step (CPU: replayed
from the profiler's allocation events; CUDA: max_memory_allocated above the level before the step).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from benchmarks.encodec_balancer import encodec_step
from benchmarks.peers import libmtl_weighting
from benchmarks.runs import hps_mlp
from benchmarks.timing import interleaved, markdown_table, medians, seconds_per_call, sync
from mtl_bench.analysis.machine import machine_description
from mtl_bench.balancers import Balancer, FixedWeights, GradNorm, RescaledNormBalancer
from mtl_bench.balancers.upgrad import UPGradWeighting
from mtl_bench.gradient_engine.balancer import BackwardContext
from mtl_bench.models.base import MultiTaskModel

VARIANTS: dict[str, Callable[[MultiTaskModel, list[str]], Balancer | Callable]] = {
    "fixed": lambda model, names: FixedWeights(names),
    "rescaled_norm": lambda model, names: RescaledNormBalancer(names),
    "encodec Balancer (peer)": lambda model, names: encodec_step(names),
    "encodec Balancer + heads": lambda model, names: encodec_step(names, train_heads=True),
    "gradnorm shared_rep": lambda model, names: GradNorm(names, grad_source="shared_rep"),
    "gradnorm last_shared": lambda model, names: GradNorm(names, shared_layer=model.last_shared_layer),
}
# Loss-level methods (no per-task gradient): their goal is the fixed step's time (<= 1.05x).
LOSS_LEVEL = [
    "UncertaintyWeighting",
    "DynamicWeightAverage",
    "RandomLossWeighting",
    "FAMO",
    "ScaleInvariant",
    "GeometricLoss",
    "SmoothTchebycheff",
    "COSMOS",
    "PenaltyBoundaryIntersection",
]
GENERIC = (
    "gradnorm last_shared (generic autograd)",
    lambda model, names: GradNorm(names, shared_params=model.last_shared_layer.parameters()),
)


class Runner:
    """One variant of one configuration: its own copy of the model, optimizer and balancer.

    `make` returns a Balancer, or (for a peer library) a function `backward(model, x, targets)` that runs the
    forward and that library's backward. A Balancer gets a context as the trainer's loop hands it: a tensor
    backward factor (the loop's guard against non-finite losses sets one each step) and `measure` false, as at
    the steps between logging steps (`trainer.log_every`, 50 by default); `--measure` times logging steps."""

    measure = False  # set by --measure

    def __init__(
        self,
        model: MultiTaskModel,
        make: Callable[[MultiTaskModel, list[str]], Balancer | Callable],
        x: torch.Tensor,
        targets: dict[str, torch.Tensor],
        micro: Sequence[tuple[torch.Tensor, dict[str, torch.Tensor]]] = (),
    ) -> None:
        """`micro`: the micro-batches of a step with gradient accumulation (the independent draws of SDMGrad and
        MoDo), instead of (x, targets); a peer that takes them all at once has `takes_batches`."""
        self.model = copy.deepcopy(model)
        made = make(self.model, list(targets))
        self.balancer = made.to(x.device) if isinstance(made, Balancer) else None
        self.peer = None if isinstance(made, Balancer) else made
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4, fused=True)  # as the trainer's optim=adam
        self.batches = list(micro) or [(x, targets)]
        k = len(self.batches)  # the loop's context under accumulation: each micro-batch's loss times 1/k
        self.ctx = BackwardContext(
            factor=torch.full((), 1 / k, device=x.device), accumulation_steps=k, measure=Runner.measure
        )

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        if self.peer is not None:
            if getattr(self.peer, "takes_batches", False):
                self.peer(self.model, self.batches)
            else:
                for x, targets in self.batches:
                    self.peer(self.model, x, targets)
            self.opt.step()
            return
        for x, targets in self.batches:
            out = self.model(x)
            losses = {name: F.mse_loss(out.preds[name], y) for name, y in targets.items()}
            self.balancer.backward(losses, out.shared, self.ctx)
        self.opt.step()
        self.balancer.step()


def time_steps(runner: Runner, steps: int, device: torch.device) -> float:
    return seconds_per_call(runner.step, steps, device)


def timers(runners: dict[str, Runner], steps: int, device: torch.device) -> dict[str, Callable[[], float]]:
    """Per runner: seconds per step over a block of `steps` steps (for `interleaved`)."""
    return {name: (lambda r=runner: time_steps(r, steps, device)) for name, runner in runners.items()}


def peak_step_memory(runner: Runner, device: torch.device) -> float:
    """Bytes live at the high-water mark of one step, counting only blocks allocated during the step."""
    if device.type == "cuda":
        sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        runner.step()
        sync(device)
        return float(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        runner.step()
    # CPU has no allocator statistics: replay the profiler's allocation events. Frees of blocks that were
    # allocated before the step (last step's gradients) are ignored, so the peak is not understated.
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        with open(f"{tmp}/trace.json") as f:
            trace = json.load(f)["traceEvents"]
    events = sorted((e["ts"], e["args"]["Addr"], e["args"]["Bytes"]) for e in trace if e.get("name") == "[memory]")
    live: dict[int, int] = {}
    level = peak = 0
    for _, addr, nbytes in events:
        if nbytes > 0:
            live[addr] = nbytes
            level += nbytes
        elif addr in live:
            level -= live.pop(addr)
        peak = max(peak, level)
    return float(peak)


def bench_config(
    label: str,
    model: MultiTaskModel,
    batch: int,
    head_dim: int,
    variants: dict,
    rounds: int,
    steps: int,
    device: torch.device,
) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    names = list(model.heads)
    x = torch.randn(batch, 250, generator=g).to(device)
    targets = {n: torch.randn(batch, head_dim, generator=g).to(device) for n in names}
    model = model.to(device)
    runners = {name: Runner(model, make, x, targets) for name, make in variants.items()}
    for runner in runners.values():  # warm-up: allocator, lazy state, first-step L_i(0)
        time_steps(runner, 2, device)
    times = medians(interleaved(timers(runners, steps, device), rounds))
    memory = {name: peak_step_memory(runner, device) for name, runner in runners.items()}
    base_t, base_m = times["fixed"], memory["fixed"]
    rows = []
    for name in runners:
        t = times[name]
        rows.append(
            {
                "model": label,
                "T": len(names),
                "head": head_dim,
                "balancer": name,
                "ms": 1e3 * t,
                "x_time": t / base_t,
                "mb": memory[name] / 2**20,
                "x_mem": memory[name] / base_m,
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------- --peers


def _ours(cls_name: str, **options) -> Callable[[MultiTaskModel, list[str]], Balancer]:
    import mtl_bench.balancers as balancers

    def make(model: MultiTaskModel, names: list[str]) -> Balancer:
        return getattr(balancers, cls_name)(names, list(model.shared_parameters()), **options)

    return make


def _floor(model: MultiTaskModel, names: list[str]) -> Callable:
    """One forward, then one backward per task (heads and trunk), each accumulated into `.grad`."""

    def backward(model: MultiTaskModel, x: torch.Tensor, targets: dict[str, torch.Tensor]) -> None:
        out = model(x)
        losses = [F.mse_loss(out.preds[n], y) for n, y in targets.items()]
        for i, loss in enumerate(losses):
            loss.backward(retain_graph=i < len(losses) - 1)

    return backward


def _torchjd(aggregator_name: str, **options) -> Callable:
    """torchjd's aggregator `aggregator_name`; "CRMOGM:<Weighting>" wraps that weighting in CRMOGMWeighting."""

    def make(model: MultiTaskModel, names: list[str]) -> Callable:
        from torchjd import aggregation, autojac

        if aggregator_name.startswith("CRMOGM:"):
            base = getattr(aggregation, aggregator_name.split(":")[1])()
            aggregator = aggregation.GramianWeightedAggregator(aggregation.CRMOGMWeighting(base, **options))
        else:
            kwargs = {"n_tasks": len(names)} if aggregator_name == "NashMTL" else {}
            aggregator = getattr(aggregation, aggregator_name)(**kwargs, **options)
        shared = list(model.shared_parameters())

        def backward(model: MultiTaskModel, x: torch.Tensor, targets: dict[str, torch.Tensor]) -> None:
            out = model(x)
            autojac.mtl_backward([F.mse_loss(out.preds[n], y) for n, y in targets.items()], features=out.shared)
            autojac.jac_to_grad(shared, aggregator)

        return backward

    return make


def _torchjd_two_batches(weighting_name: str, **options) -> Callable:
    """torchjd's SDMGradWeighting / MoDoWeighting as their docstrings use them on three batches: the Jacobians of
    the first two (`autojac.jac`, at the shared parameters), the weights from J₁J₂ᵀ, and the third batch's losses
    backward with those weights."""

    def make(model: MultiTaskModel, names: list[str]) -> Callable:
        from torchjd import aggregation, autojac

        weighting = getattr(aggregation, weighting_name)(**options)
        shared = list(model.shared_parameters())

        def losses(x: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
            out = model(x)
            return torch.stack([F.mse_loss(out.preds[n], y) for n, y in targets.items()])

        def backward(model: MultiTaskModel, batches: list[tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> None:
            j1, j2 = (torch.cat([j.flatten(1) for j in autojac.jac(losses(x, t), shared)], 1) for x, t in batches[:2])
            losses(*batches[2]).backward(weighting(j1 @ j2.T))

        backward.takes_batches = True  # type: ignore[attr-defined]
        return backward

    return make


def _libmtl(name: str, rep_grad: bool = False, **kwargs) -> Callable:
    def make(model: MultiTaskModel, names: list[str]) -> Callable:
        weighting = libmtl_weighting(name, model, names, rep_grad)

        def backward(model: MultiTaskModel, x: torch.Tensor, targets: dict[str, torch.Tensor]) -> None:
            rep = model.trunk(x)
            if rep_grad:
                weighting.rep = rep
                weighting.rep_tasks = {n: rep.detach().clone().requires_grad_(True) for n in names}
                inputs = weighting.rep_tasks
            else:
                inputs = {n: rep for n in names}
            losses = torch.stack([F.mse_loss(model.heads[n](inputs[n]), targets[n]) for n in names])
            weighting.backward(losses, **kwargs)

        return backward

    return make


# (method, variant, make): "ours" exact, "ours rep" (grad_source=shared_rep), "torchjd", "LibMTL".
PEERS: list[tuple[str, str, Callable]] = [
    ("pcgrad", "ours", _ours("PCGrad", seed=0)),
    ("pcgrad", "torchjd", _torchjd("PCGrad")),
    ("pcgrad", "LibMTL", _libmtl("PCGrad")),
    ("mgda", "ours", _ours("MGDA")),
    ("mgda", "ours rep", _ours("MGDA", grad_source="shared_rep")),
    ("mgda", "torchjd", _torchjd("MGDA")),
    ("mgda", "LibMTL", _libmtl("MGDA", mgda_gn="none")),
    ("upgrad", "ours", _ours("UPGrad")),
    ("upgrad", "torchjd", _torchjd("UPGrad")),
    ("imtl", "ours", _ours("IMTL", mode="gradient")),
    ("imtl", "ours rep", _ours("IMTL", mode="gradient", grad_source="shared_rep")),
    ("imtl", "torchjd", _torchjd("IMTLG")),
    ("imtl", "LibMTL", _libmtl("IMTL")),
    ("aligned_mtl", "ours", _ours("AlignedMTL")),
    ("aligned_mtl", "ours rep", _ours("AlignedMTL", grad_source="shared_rep")),
    ("aligned_mtl", "torchjd", _torchjd("AlignedMTL")),
    ("gradvac", "ours", _ours("GradVac", seed=0)),
    ("gradvac", "torchjd", _torchjd("GradVac")),
    ("gradvac", "LibMTL", _libmtl("GradVac", beta=0.5)),
    ("cagrad", "ours", _ours("CAGrad")),
    ("cagrad", "torchjd", _torchjd("CAGrad", c=0.5)),
    ("nash_mtl", "ours", _ours("NashMTL", head_weights="ones")),
    ("nash_mtl", "torchjd", _torchjd("NashMTL")),
    ("graddrop", "ours rep", _ours("GradDrop", seed=0)),
    ("graddrop", "LibMTL", _libmtl("GradDrop", rep_grad=True, leak=0.0)),
    ("fairgrad", "ours", _ours("FairGrad", alpha=1.0)),
    ("fairgrad", "torchjd", _torchjd("FairGrad", alpha=1.0)),
    ("dualproj", "ours", _ours("DualProj")),
    ("dualproj", "torchjd", _torchjd("DualProj")),
    ("con_fig", "ours", _ours("ConFIG")),
    ("con_fig", "torchjd", _torchjd("ConFIG")),
    ("pcd", "ours", _ours("PCD")),
    ("pcd", "torchjd", _torchjd("PCD")),
    ("excess_mtl", "ours", _ours("ExcessMTL", robust_step_size=0.5, total="one", head_weights="ones")),
    ("excess_mtl", "torchjd", _torchjd("ExcessMTL", robust_step_size=0.5, n_warmup_steps=1)),
    ("cr_mogm", "ours", _ours("CRMOGM", base=UPGradWeighting, alpha=0.5)),
    ("cr_mogm", "torchjd", _torchjd("CRMOGM:UPGradWeighting", alpha=0.5)),
    ("krum", "ours", _ours("Krum", n_byzantine=0, n_selected=1)),
    ("krum", "torchjd", _torchjd("Krum", n_byzantine=0, n_selected=1)),
    ("trimmed_mean", "ours", _ours("TrimmedMean", trim=1)),
    ("trimmed_mean", "torchjd", _torchjd("TrimmedMean", trim_number=1)),
    ("moco", "ours", _ours("MoCo")),  # LibMTL main only (not the installed 1.1.5): no peer here
    ("db_mtl", "ours", _ours("DualBalancing")),  # likewise
    ("sdmgrad", "ours", _ours("SDMGrad")),
    ("sdmgrad", "torchjd", _torchjd_two_batches("SDMGradWeighting", lr=5.0)),
    ("modo", "ours", _ours("MoDo")),
    ("modo", "torchjd", _torchjd_two_batches("MoDoWeighting", gamma=0.001, rho=0.1)),
]
# Methods with fewer valid task counts: Krum (f=0) and a trimmed mean with trim=1 need T >= 3.
MIN_TASKS = {"krum": 3, "trimmed_mean": 3}
# Methods whose step takes several independent batches (the micro-batches of gradient accumulation): every variant
# of theirs, the fixed step and the floor included, runs that many micro-batches of the same size a step.
MICRO_BATCHES = {"sdmgrad": 3, "modo": 3}


def bench_peers(
    tasks: list[int], rounds: int, steps: int, device: torch.device, memory: bool, only: list[str] | None = None
) -> list[dict]:
    """Each method's variants on identical copies of the model, interleaved with the fixed step, per T."""
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)  # cvxpy's DPP notice for torchjd's Nash-MTL
    rows = []
    for t in tasks:
        torch.manual_seed(0)
        model = hps_mlp(512, 4, t, 1).to(device)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 250, generator=g).to(device)
        targets = {n: torch.randn(256, 1, generator=g).to(device) for n in model.heads}
        draws = [
            (
                torch.randn(256, 250, generator=g).to(device),
                {n: torch.randn(256, 1, generator=g).to(device) for n in model.heads},
            )
            for _ in range(max(MICRO_BATCHES.values()) - 1)
        ]
        methods = sorted({m for m, _, _ in PEERS}, key=[m for m, _, _ in PEERS].index)
        methods = [m for m in methods if only is None or m in only]
        for method in methods:
            if t < MIN_TASKS.get(method, 1):
                continue
            micro = [(x, targets), *draws][: MICRO_BATCHES.get(method, 0)]
            variants = {
                "fixed": Runner(model, lambda mdl, names: FixedWeights(names), x, targets, micro),
                "floor": Runner(model, _floor, x, targets, micro),
            }
            for m, variant, make in PEERS:
                if m == method:
                    variants[variant] = Runner(model, make, x, targets, micro)
            for runner in variants.values():
                time_steps(runner, 2, device)  # warm-up: allocator, lazy state, cvxpy's first compile
            med = medians(interleaved(timers(variants, steps, device), rounds))
            mem = {name: peak_step_memory(r, device) for name, r in variants.items()} if memory else {}
            base = med["fixed"]
            for name in variants:
                if name in ("fixed", "floor") and (name == "fixed" or method != methods[0] or micro):
                    continue  # the floor's row once per T (it is timed again beside every method)
                rows.append(
                    {
                        "T": t,
                        "method": method,
                        "variant": name,
                        "ms": 1e3 * med[name],
                        "x_fixed": med[name] / base,
                        "fixed_ms": 1e3 * base,
                        "x_floor": med[name] / med["floor"],
                        "x_torchjd": med[name] / med["torchjd"] if "torchjd" in med and name != "floor" else None,
                        "x_libmtl": med[name] / med["LibMTL"] if "LibMTL" in med and name != "floor" else None,
                        "mb": mem.get(name, float("nan")) / 2**20,
                    }
                )
            ratios = ", ".join(f"{n} {v / base:.2f}x fixed, {v / med['floor']:.2f}x floor" for n, v in med.items())
            print(f"T={t} {method}: {ratios}", flush=True)
    return rows


def print_peers(rows: list[dict]) -> None:
    fmt = lambda v: "" if v is None else f"{v:.2f}"  # noqa: E731
    header = ["T", "method", "variant", "ms/step", "x fixed", "x floor", "x torchjd", "x LibMTL", "peak MB/step"]
    cells = [
        [r["T"], r["method"], r["variant"], f"{r['ms']:.1f}", f"{r['x_fixed']:.2f}", f"{r['x_floor']:.2f}"]
        + [fmt(r["x_torchjd"]), fmt(r["x_libmtl"]), f"{r['mb']:.1f}"]
        for r in rows
    ]
    print(markdown_table(header, cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; times are medians over them")
    parser.add_argument("--steps", type=int, default=4, help="steps timed per round")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1: steadier ratios on a small shared machine; 0: torch's default)",
    )
    parser.add_argument("--tasks", default="2,10,40", help="task counts of the wide MLP")
    parser.add_argument("--head-dims", default="100,1", help="output sizes of the wide MLP's heads")
    parser.add_argument("--generic", action="store_true", help="also GradNorm's generic per-parameter path")
    parser.add_argument("--loss-level", action="store_true", help="also the loss-level methods (LOSS_LEVEL)")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="the gradient methods against torchjd and LibMTL (scalar heads; --tasks default 2,10)",
    )
    parser.add_argument("--no-memory", action="store_true", help="--peers: skip the peak-memory measurement")
    parser.add_argument("--methods", default=None, help="--peers: only these methods (comma-separated; default all)")
    parser.add_argument(
        "--measure", action="store_true", help="time logging steps: the balancers also compute their measurements"
    )
    args = parser.parse_args()
    Runner.measure = args.measure
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.peers:
        started = time.perf_counter()
        tasks = [int(t) for t in (args.tasks if args.tasks != "2,10,40" else "2,10").split(",")]
        only = None if args.methods is None else args.methods.split(",")
        unknown = sorted(set(only or []) - {m for m, _, _ in PEERS})
        if unknown:
            parser.error(f"--methods: unknown {unknown}; allowed: {sorted({m for m, _, _ in PEERS})}")
        rows = bench_peers(tasks, args.rounds, args.steps, device, not args.no_memory, only)
        print(
            f"\n{machine_description()}; on {device.type}, {args.rounds} rounds x {args.steps} steps, "
            f"{time.perf_counter() - started:.0f} s in all\n"
        )
        print_peers(rows)
        return
    variants = dict(VARIANTS)
    if args.generic:
        variants[GENERIC[0]] = GENERIC[1]
    if args.loss_level:
        import mtl_bench.balancers as balancers

        for cls_name in LOSS_LEVEL:
            variants[cls_name] = lambda model, names, c=getattr(balancers, cls_name): c(names)

    torch.manual_seed(0)
    configs = [("toy MLP 4x100, batch 100", hps_mlp(100, 4, 10, 100), 100, 100)]
    for head_dim in (int(h) for h in args.head_dims.split(",")):
        for tasks in (int(t) for t in args.tasks.split(",")):
            configs.append(("wide MLP 4x512, batch 256", hps_mlp(512, 4, tasks, head_dim), 256, head_dim))

    started = time.perf_counter()
    rows = []
    for label, model, batch, head_dim in configs:
        rows += bench_config(label, model, batch, head_dim, variants, args.rounds, args.steps, device)
    print(
        f"{machine_description()}; on {device.type}, {args.rounds} rounds x {args.steps} steps, "
        f"{time.perf_counter() - started:.0f} s in all\n"
    )
    header = ["model", "T", "head out", "balancer", "ms/step", "x fixed", "peak MB/step", "x fixed"]
    cells = [
        [r["model"], r["T"], r["head"], r["balancer"], f"{r['ms']:.1f}", f"{r['x_time']:.2f}"]
        + [f"{r['mb']:.1f}", f"{r['x_mem']:.2f}"]
        for r in rows
    ]
    print(markdown_table(header, cells))


if __name__ == "__main__":
    main()
