# Source: ScaledAdam of k2-fsa/icefall egs/librispeech/ASR/zipformer/optim.py (Daniel Povey, Apache-2.0); own code.
"""ScaledAdam: Adam whose update for each tensor is scaled by that tensor's RMS and which also learns each
tensor's overall scale; scalars get plain Adam. See docs in `ScaledAdam`.

Two implementations of one algorithm, chosen once at construction (`kernel`), named by `implementation`:

- "C++ kernel": float32 CPU tensors go through scaled_adam_cpu.cpp, built by torch.utils.cpp_extension at
  first use (scaled_adam_kernel.py). A step makes two passes over memory: the statistics pass reads g (p too every
  `size_update_period`-th step: the RMS refresh and the scale step need p before that step's update), then the
  update pass reads p, g, delta, exp_avg_sq and writes p, delta, exp_avg_sq, as fused Adam does, and returns
  the sum p*g the learned scale needs from the same loop. Scalars, and any tensor the kernel cannot take, go eager.
- "eager": plain torch ops. Parameters of one group are bucketed by (device, dtype, shape); per-row scalar
  work (clipping norm, parameter RMS, scale learning, bias corrections) runs once per bucket on stacked (n,)
  tensors. `_stats` reads p and g, `_update` reads p, g, delta, exp_avg_sq and writes p, delta, exp_avg_sq,
  over lists of 2-D (rows, elements) tensors: the whole bucket stacked into one (small tensors, non-CPU
  devices) or each tensor's own memory viewed as one row (large CPU tensors, where a stack copy costs more
  memory traffic than the update itself).

torch.compile is not used: inductor does not fuse the reduction sum p*g into the loop that overwrites p (it
makes a second loop over p and g), so the compiled update was about 2x fused Adam where the kernel is 1.2x
(docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Callable, Iterable, Literal, Union

import torch
from torch import Tensor

from mtl_bench.errors import ConfigError
from mtl_bench.optim import scaled_adam_kernel

log = logging.getLogger(__name__)

KernelMode = Union[bool, Literal["auto"]]
KERNEL = "C++ kernel"
EAGER = "eager"

# kernel="auto" takes the kernel when the float32 CPU tensors with more than one element hold at least this
# many elements: building it costs a minute once per machine (then it is cached), and a small model gains little.
AUTO_KERNEL_MIN_NUMEL = 1 << 20
# On CPU, tensors up to this many elements are stacked per bucket; larger ones are updated in place.
STACK_MAX_NUMEL = 1 << 16
# Large same-shape tensors handed to one call of `_stats` / `_update` on the eager path.
CHUNK = 4
# Steps at which a first clipping threshold is estimated (2x looser), besides multiples of the period.
IRREGULAR_ESTIMATES = (10, 20, 40)


def _stats(ps: list[Tensor], gs: list[Tensor]) -> Tensor:
    """For lists of (r, m) tensors: float32 (sum r, 3) of [sum g^2, sum p*g, sum p^2] per row, in order.

    One read of p and g. Sums accumulate in float64 (exact enough that eager and compiled agree, and cheaper
    under inductor than its cascaded float32 sum); products are float32 as in icefall.
    """
    out = []
    for p, g in zip(ps, gs):
        p, g = p.float(), g.float()
        out.append(
            torch.stack(
                (
                    (g * g).sum(1, dtype=torch.float64),
                    (p * g).sum(1, dtype=torch.float64),
                    (p * p).sum(1, dtype=torch.float64),
                ),
                dim=1,
            )
        )
    return torch.cat(out).float()


def _update(
    ps: list[Tensor],
    gs: list[Tensor],
    deltas: list[Tensor],
    avg_sqs: list[Tensor],
    alpha: Tensor,
    size: Tensor,
    consts: Tensor,
) -> None:
    """One pass over lists of (r, m) tensors, in place on p, delta and exp_avg_sq (float32).

    alpha, size (sum r, 1): per row, in order; consts (5,): [clip, beta1, beta2, exp_avg_sq scale, eps].
    v <- beta2*v + (1-beta2)*g'^2;  delta <- beta1*delta + size*p + alpha*g'/(sqrt(v*scale)+eps);  p <- p + delta,
    with g' = clip*g. In-place ops keep the eager path to two temporaries; compiled, it is one loop.
    """
    clip, beta1, beta2, v_scale, eps = consts.unbind()
    r0 = 0
    for p, g, delta, v in zip(ps, gs, deltas, avg_sqs):
        r1 = r0 + p.shape[0]
        g32 = g.float() * clip
        v.mul_(beta2).addcmul_(g32, g32 * (1 - beta2))
        step = g32.div_((v * v_scale).sqrt_().add_(eps))
        delta.mul_(beta1).addcmul_(p.float(), size[r0:r1]).addcmul_(step, alpha[r0:r1])
        p.add_(delta)
        r0 = r1


def _own(t: Tensor) -> Tensor:
    """`t` if it is contiguous and owns its memory, else a contiguous copy."""
    return t if t._base is None and t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)


def kernel_takes(p: Tensor) -> bool:
    """Whether the C++ kernel can update `p`: a float32 contiguous CPU tensor with more than one element."""
    return p.numel() > 1 and p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous()


@dataclass
class _Bucket:
    params: list[Tensor]
    index: list[int]  # positions in the group, for names
    numel: int  # elements per tensor
    stacked: bool
    rows: dict[str, Tensor] = field(default_factory=dict)  # stacked state: param_rms, scale_* (n,), delta...
    # per-tensor layout: (1, numel) views of each tensor's own delta and exp_avg_sq
    deltas: list[Tensor] = field(default_factory=list)
    avg_sqs: list[Tensor] = field(default_factory=list)
    # this step's inputs: lists of 2-D tensors, one stacked (n, numel) or n views (1, numel)
    ps: list[Tensor] | None = None
    gs: list[Tensor] | None = None
    stats: Tensor | None = None  # this step's (n, 3) row stats
    pg_ready: bool = True  # stats[:, 1] holds this step's sum p*g (else the kernel's update pass returns it)
    calls: list[tuple[int, int]] = field(default_factory=list)  # `chunks()`, fixed with the plan
    native: bool = False  # stepped by the C++ kernel (each tensor its own memory)

    def clear(self) -> None:
        self.ps = self.gs = self.stats = None

    @property
    def scalar(self) -> bool:
        return self.numel == 1

    def chunks(self) -> list[tuple[int, int]]:
        """(start, stop) of the tensors each call covers: CHUNK at a time, the remainder one by one."""
        n = 1 if self.stacked else len(self.params)
        full = n - n % CHUNK
        return [(i, i + CHUNK) for i in range(0, full, CHUNK)] + [(i, i + 1) for i in range(full, n)]


@dataclass
class _NativeSet:
    """The buckets of one group that the C++ kernel steps: each pass is one call over all their tensors."""

    buckets: list[_Bucket]
    params: list[Tensor]
    deltas: list[Tensor]  # each tensor's delta and exp_avg_sq, flat views of the optimizer state
    avg_sqs: list[Tensor]
    grads: list[Tensor] | None = None  # this step's float32 contiguous gradients, alive across both passes

    def valid(self) -> bool:
        """The parameters still are what the plan saw (float32, contiguous, on the CPU, same size)."""
        return all(kernel_takes(p) and p.numel() == b.numel for b in self.buckets for p in b.params)


class ScaledAdam(torch.optim.Optimizer):
    """ScaledAdam (icefall semantics, newest zipformer version).

    For a tensor with more than one element the update is Adam's normalised gradient times the tensor's
    RMS (floored at `param_min_rms`), so every tensor changes by about `lr` relative to its size. Every
    `size_update_period` steps the RMS is refreshed and the tensor's overall scale takes an Adam step in
    log space (learning rate `lr * scalar_lr_scale`), never shrinking below `param_min_rms` nor growing past
    `param_max_rms`. Tensors with one element get Adam with `lr * scalar_lr_scale`, clamped to
    `+-scalar_max` after the update. Momentum is a stored `delta` (no first-moment bias correction).

    `clipping_scale`: the group's gradient norm, each tensor's gradient weighted by its RMS (scalars by
    `scalar_lr_scale`), is clipped to `clipping_scale` x the median of the last `clipping_update_period`
    norms (first estimates at steps 10, 20, 40 with a 2x looser threshold); the factor scales the gradient
    the whole update sees. A step whose gradient norm is not finite changes nothing and is logged
    (`skipped_steps` counts them).

    State is float32 for any parameter dtype. A step makes one host read (the gradient norm: the skip and the
    clipping factor depend on it). `implementation` says which path runs ("C++ kernel": float32 CPU tensors
    through scaled_adam_cpu.cpp, the rest eagerly; or "eager") and `implementation_reason` why; both are
    decided at construction and logged once on the "mtl_bench" logger. `kernel=True` raises ValueError("kernel:
    ...") when the kernel cannot be had (no compiler, other dtypes or devices; ConfigError if a parameter changes
    to such later); "auto" then runs eagerly and says why.
    """

    skips_nonfinite = True  # a step with a non-finite gradient norm is skipped inside step() (the trainer relies on it)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 3e-2,
        clipping_scale: float | None = None,
        betas: tuple[float, float] = (0.9, 0.98),
        scalar_lr_scale: float = 0.1,
        eps: float = 1e-8,
        param_min_rms: float = 1e-5,
        param_max_rms: float = 3.0,
        scalar_max: float = 10.0,
        size_update_period: int = 4,
        clipping_update_period: int = 100,
        kernel: KernelMode = "auto",
        diagnostics: bool = False,
    ) -> None:
        """One line per option (the signature is the options' one declaration; the class docstring explains them).

        params: tensors, `named_parameters()` or groups (`params`/icefall's `named_params`); names label logs.
        lr: learning rate (>= 0); a non-scalar tensor moves by about `lr` times its RMS per step.
        clipping_scale: clip the RMS-weighted gradient norm at this multiple (> 0) of the recent median; None: off.
        betas: (beta1, beta2), 0 < beta1 <= beta2 < 1: momentum of `delta`, decay of the squared-gradient average.
        scalar_lr_scale: factor (>= 0) on `lr` for one-element tensors and for the learned scales.
        eps: added (>= 0) to the root of the squared-gradient average.
        param_min_rms: RMS floor (> 0) for scaling updates; the learned scale never shrinks a tensor below it.
        param_max_rms: RMS ceiling (> param_min_rms); the learned scale never grows a tensor past it.
        scalar_max: one-element tensors are clamped to +-scalar_max (> 0) after each update.
        size_update_period: steps (>= 1) between RMS refreshes and learned-scale steps.
        clipping_update_period: steps (>= 1) between clipping thresholds, each the median of that many norms.
        kernel: True: the C++ kernel or an error; False: eager, same math; "auto": kernel from 2^20 elements.
        diagnostics: icefall's clipping lines (each threshold's norm quartiles at INFO, a gradient scaled below 0.1
            with its dominant tensor at WARNING); False: both at DEBUG. Skipped non-finite steps are always WARNING.
        """
        if not lr >= 0:
            raise ValueError(f"lr: must be >= 0, got {lr}")
        if clipping_scale is not None and not clipping_scale > 0:
            raise ValueError(f"clipping_scale: must be > 0 or None, got {clipping_scale}")
        if len(betas) != 2 or not 0 < betas[0] <= betas[1] < 1:
            raise ValueError(f"betas: must be (beta1, beta2) with 0 < beta1 <= beta2 < 1, got {tuple(betas)}")
        if not scalar_lr_scale >= 0:
            raise ValueError(f"scalar_lr_scale: must be >= 0, got {scalar_lr_scale}")
        if not eps >= 0:
            raise ValueError(f"eps: must be >= 0, got {eps}")
        if not param_min_rms > 0:
            raise ValueError(f"param_min_rms: must be > 0, got {param_min_rms}")
        if not param_max_rms > param_min_rms:
            raise ValueError(f"param_max_rms: must be > param_min_rms ({param_min_rms}), got {param_max_rms}")
        if not scalar_max > 0:
            raise ValueError(f"scalar_max: must be > 0, got {scalar_max}")
        for name, period in (
            ("size_update_period", size_update_period),
            ("clipping_update_period", clipping_update_period),
        ):
            if isinstance(period, bool) or not isinstance(period, int) or period < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {period!r}")
        if not isinstance(diagnostics, bool):
            raise ValueError(f"diagnostics: must be true or false, got {diagnostics!r}")
        if kernel not in ("auto", True, False) or not isinstance(kernel, (bool, str)):
            raise ValueError(f"kernel: must be 'auto', True or False, got {kernel!r}")
        defaults = dict(
            lr=lr,
            clipping_scale=clipping_scale,
            betas=tuple(betas),
            scalar_lr_scale=scalar_lr_scale,
            eps=eps,
            param_min_rms=param_min_rms,
            param_max_rms=param_max_rms,
            scalar_max=scalar_max,
            size_update_period=size_update_period,
            clipping_update_period=clipping_update_period,
        )
        self.kernel = kernel
        # icefall's clipping diagnostics: their log levels (DEBUG unless asked for: a default run stays quiet)
        self.diagnostics = bool(diagnostics)
        self._info, self._warning = (logging.INFO, logging.WARNING) if diagnostics else (logging.DEBUG, logging.DEBUG)
        self.stack_max_numel = STACK_MAX_NUMEL  # tests and benchmarks change it to force a layout
        self.skipped_steps = 0
        self._plans: list[tuple[tuple[int, ...], list[_Bucket], _NativeSet | None]] | None = None
        self._native = False
        super().__init__(params, defaults)
        self._native, self.implementation_reason = self._choose()
        self.implementation = KERNEL if self._native else EAGER
        logging.getLogger("mtl_bench").info(
            "ScaledAdam: %s update (%s)", self.implementation, self.implementation_reason
        )

    # ------------------------------------------------------------------ torch.optim.Optimizer plumbing
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if "named_params" in param_group:  # icefall's spelling of a named group
            param_group = dict(param_group)
            param_group["params"] = list(param_group.pop("named_params"))
        super().add_param_group(param_group)
        self._plans = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._plans = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # torch casts floating state to each parameter's dtype; ours stays float32, so copy it back unchanged.
        super().load_state_dict(state_dict)
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        for saved_id, p in zip(saved_ids, chain.from_iterable(g["params"] for g in self.param_groups)):
            for key, value in state_dict["state"].get(saved_id, {}).items():
                if isinstance(value, Tensor) and value.is_floating_point():
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)
        self._plans = None

    def param_name(self, group_index: int, index: int) -> str:
        """The name given for a parameter, else one derived from its position and shape."""
        group = self.param_groups[group_index]
        names = group.get("param_names")
        if names is not None:
            return str(names[index])
        return f"group{group_index}.params[{index}]{tuple(group['params'][index].shape)}"

    # ------------------------------------------------------------------ layout
    def _plan(self, gi: int, group: dict[str, Any]) -> tuple[list[_Bucket], _NativeSet | None]:
        key = tuple(id(p) for p in group["params"])
        if self._plans is None:
            self._plans = [None] * len(self.param_groups)  # type: ignore[list-item]
        plan = self._plans[gi]
        if plan is None or plan[0] != key or (plan[2] is not None and not plan[2].valid()):
            buckets = self._build_buckets(gi, group)
            plan = (key, buckets, self._native_set(buckets))
            self._plans[gi] = plan
        return plan[1], plan[2]

    def _build_buckets(self, group_index: int, group: dict[str, Any]) -> list[_Bucket]:
        by_key: dict[tuple[Any, ...], _Bucket] = {}
        for i, p in enumerate(group["params"]):
            if p.grad is not None and p.grad.is_sparse:
                raise RuntimeError("ScaledAdam does not support sparse gradients")
            k = (str(p.device), p.dtype, tuple(p.shape))
            if k not in by_key:
                by_key[k] = _Bucket([], [], p.numel(), stacked=False)
            by_key[k].params.append(p)
            by_key[k].index.append(i)
        buckets = list(by_key.values())
        for b in buckets:
            dev = b.params[0].device
            contiguous = all(p.is_contiguous() for p in b.params)
            b.native = self._native and all(kernel_takes(p) for p in b.params)
            if self.kernel is True and not b.scalar and not b.native:
                raise ConfigError(
                    f"kernel: true needs float32 contiguous CPU parameters (ScaledAdam's C++ kernel); "
                    f"{self.param_name(group_index, b.index[0])} is {dev.type} {b.params[0].dtype}"
                    f"{'' if contiguous else ', not contiguous'}; set kernel=auto or false"
                )
            b.stacked = not b.native and (
                b.scalar or b.numel <= self.stack_max_numel or dev.type != "cpu" or not contiguous
            )
            b.calls = b.chunks()
            states = [self.state[p] for p in b.params]
            for p, st in zip(b.params, states):
                if not st:
                    self._init_state(group, p, st)
            step = states[0]["step"]
            for st in states:  # one counter per bucket; members always step together
                st["step"] = step
            # Stack the per-row state once and make each parameter's state a view of it, so the state_dict
            # keeps torch's per-parameter format while a step touches one tensor per bucket. The per-tensor
            # layout keeps each tensor's delta and exp_avg_sq apart, on its own memory, as the kernel wants them.
            names = ["delta", "exp_avg_sq"] if b.stacked else []
            if not b.stacked:  # each its own memory (a bucket stacked before left views of one storage)
                for st in states:
                    st["delta"], st["exp_avg_sq"] = _own(st["delta"]), _own(st["exp_avg_sq"])
                b.deltas = [st["delta"].view(1, -1) for st in states]
                b.avg_sqs = [st["exp_avg_sq"].view(1, -1) for st in states]
            if not b.scalar:
                names += ["param_rms", "scale_exp_avg_sq", "scale_grads"]
            for name in names:
                stack = torch.stack(
                    [st[name].reshape(-1) if name in ("delta", "exp_avg_sq") else st[name] for st in states]
                ).to(device=dev, dtype=torch.float32)
                b.rows[name] = stack
                for i, (p, st) in enumerate(zip(b.params, states)):
                    st[name] = stack[i].view(p.shape) if name in ("delta", "exp_avg_sq") else stack[i]
        return buckets

    def _native_set(self, buckets: list[_Bucket]) -> _NativeSet | None:
        mine = [b for b in buckets if b.native]
        if not mine:
            return None
        params = [p for b in mine for p in b.params]
        deltas, avg_sqs = [self.state[p]["delta"] for p in params], [self.state[p]["exp_avg_sq"] for p in params]
        return _NativeSet(mine, params, [t.view(-1) for t in deltas], [t.view(-1) for t in avg_sqs])

    @staticmethod
    def _init_state(group: dict[str, Any], p: Tensor, st: dict[str, Any]) -> None:
        st["step"] = 0
        st["delta"] = torch.zeros(p.shape, device=p.device, dtype=torch.float32)
        st["exp_avg_sq"] = torch.zeros(p.shape, device=p.device, dtype=torch.float32)
        if p.numel() > 1:
            st["param_rms"] = p.detach().float().pow(2).mean().sqrt()
            st["scale_exp_avg_sq"] = torch.zeros((), device=p.device)
            st["scale_grads"] = torch.zeros(group["size_update_period"], device=p.device)

    def _choose(self) -> tuple[bool, str]:
        """(whether the C++ kernel takes the float32 CPU tensors, why). Where kernel=True cannot be had: ValueError
        "kernel: ...", which the engine's builder reports as the one line `optim.kernel: ...`."""
        if self.kernel is False:
            return False, "kernel=false"
        tensors = [p for g in self.param_groups for p in g["params"] if p.numel() > 1]
        takes = [p for p in tensors if kernel_takes(p)]
        if self.kernel is True:
            others = sorted(
                {f"{p.device.type} {str(p.dtype).replace('torch.', '')}" for p in tensors} - {"cpu float32"}
            )
            if others or len(takes) < len(tensors):
                raise ValueError(
                    "kernel: true needs float32 contiguous CPU parameters (ScaledAdam's C++ kernel); got "
                    + (", ".join(others) or "non-contiguous tensors")
                    + "; set kernel=auto or false"
                )
        else:
            numel = sum(p.numel() for p in takes)
            if numel < AUTO_KERNEL_MIN_NUMEL:
                return False, (
                    f"kernel=auto: {numel} elements in float32 CPU tensors, under {AUTO_KERNEL_MIN_NUMEL} "
                    "where the C++ kernel starts to pay"
                )
        module, error = scaled_adam_kernel.kernel()
        if module is None:
            if self.kernel is True:
                raise ValueError(f"kernel: true, but ScaledAdam's C++ kernel cannot be built here ({error})")
            return False, f"kernel=auto: the C++ kernel cannot be built here ({error})"
        rest = len(tensors) - len(takes)
        return True, f"kernel={str(self.kernel).lower()}" + (f"; {rest} other tensors eager" if rest else "")

    @property
    def uses_kernel(self) -> bool:
        """Whether float32 CPU tensors go through the C++ kernel (`implementation == "C++ kernel"`)."""
        return self._native

    def _call(self, which: int, *args: Any) -> Any:
        return (_stats, _update)[which](*args)

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plans = [self._plan(gi, g) for gi, g in enumerate(self.param_groups)]
        # record_function labels: what a profiler (scripts/bench_optim.py) attributes to each pass; free otherwise
        with torch.profiler.record_function("ScaledAdam.statistics"):
            norms = [self._group_stats(g, *plan) for g, plan in zip(self.param_groups, plans)]
        if not any(buckets for buckets, _ in plans):
            return loss
        dev = next(p.device for g in self.param_groups for p in g["params"])
        # The one host read per step: the skip and the clipping factor depend on it.
        host_norms = torch.stack([n.to(dev) for n in norms]).tolist()
        if not all(math.isfinite(n) for n in host_norms):
            self._report_nonfinite(plans, host_norms)
            return loss
        for gi, (group, (buckets, native)) in enumerate(zip(self.param_groups, plans)):
            if not buckets:
                continue
            first = self.state[group["params"][0]]
            clip = 1.0
            if group["clipping_scale"] is not None and first["step"] > 0:
                clip = self._clip_factor(gi, group, buckets, first, host_norms[gi], norms[gi])
            with torch.profiler.record_function("ScaledAdam.update"):
                for b in buckets:
                    if not b.native:
                        self._update_bucket(group, b, clip)
                if native is not None:
                    self._update_native(group, native, clip)
        return loss

    def _group_stats(self, group: dict[str, Any], buckets: list[_Bucket], native: _NativeSet | None) -> Tensor:
        """Row stats of every bucket (kept on the bucket) and the group's RMS-weighted gradient norm."""
        sumsq = [torch.zeros((), device=group["params"][0].device)] if group["params"] else [torch.zeros(())]
        if native is not None:
            self._native_stats(group, native)
        for b in buckets:
            if b.native:
                sumsq.append(self._row_contributions(group, b).sum())
                continue
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in b.params]
            if b.stacked:
                b.ps = [torch.stack([p.detach().reshape(-1) for p in b.params])]
                b.gs = [torch.stack([g.reshape(-1) for g in grads])]
            else:
                b.ps = [p.detach().view(1, -1) for p in b.params]
                b.gs = [g.reshape(1, -1) for g in grads]
            parts = [self._call(0, b.ps[i:j], b.gs[i:j]) for i, j in b.calls]
            b.stats = parts[0] if len(parts) == 1 else torch.cat(parts)
            sumsq.append(self._row_contributions(group, b).sum())
        return torch.stack(sumsq).sum().sqrt()

    def _update_bucket(self, group: dict[str, Any], b: _Bucket, clip: float) -> None:
        beta1, beta2 = group["betas"]
        states = [self.state[p] for p in b.params]
        step = states[0]["step"]
        assert b.stats is not None  # set by this step's statistics pass
        dev = b.stats.device
        n = len(b.params)
        bias2 = 1 - beta2 ** (step + 1)
        if b.scalar:
            alpha = torch.full((n, 1), -group["lr"] * group["scalar_lr_scale"] * (1 - beta1), device=dev)
            size = torch.zeros(n, 1, device=dev)
            v_scale = 1 / bias2
        else:
            alpha, size = self._row_coefficients(group, b, step, clip)
            v_scale = 1 / bias2 if bias2 < 0.99 else 1.0  # icefall drops the correction once it is small
        consts = torch.tensor([clip, beta1, beta2, v_scale, group["eps"]], device=dev)
        assert b.ps is not None and b.gs is not None
        if b.stacked:
            self._call(
                1,
                b.ps,
                b.gs,
                [b.rows["delta"]],
                [b.rows["exp_avg_sq"]],
                alpha,
                size,
                consts,
            )
            p2 = b.ps[0]
            if b.scalar:  # after the update, as upstream intends
                p2.clamp_(-group["scalar_max"], group["scalar_max"])
            torch._foreach_copy_([p.detach() for p in b.params], [r.view(p.shape) for r, p in zip(p2, b.params)])
        else:
            for i, j in b.calls:
                self._call(1, b.ps[i:j], b.gs[i:j], b.deltas[i:j], b.avg_sqs[i:j], alpha[i:j], size[i:j], consts)
        b.clear()
        for st in states:
            st["step"] = step + 1

    def _native_stats(self, group: dict[str, Any], ns: _NativeSet) -> None:
        """The C++ kernel's statistics pass: sum g^2 of every tensor; sum p*g and sum p^2 too when a bucket refreshes
        its RMS and takes a scale step this step (otherwise the update pass returns sum p*g)."""
        period = group["size_update_period"]
        full = any(self.state[b.params[0]]["step"] % period == period - 1 for b in ns.buckets)
        grads = []
        for p in ns.params:
            g = p.grad
            if g is None:
                g = torch.zeros_like(p)
            elif g.dtype != torch.float32 or g.device != p.device or not g.is_contiguous():
                g = g.to(device=p.device, dtype=torch.float32).contiguous()
            grads.append(g)
        kernel, _ = scaled_adam_kernel.kernel()
        stats, o = kernel.stats(ns.params, grads, full).float(), 0  # under no_grad: the parameters as they are
        for b in ns.buckets:
            b.stats, b.pg_ready = stats[o : o + len(b.params)], full
            o += len(b.params)
        ns.grads = grads

    def _update_native(self, group: dict[str, Any], ns: _NativeSet, clip: float) -> None:
        """The C++ kernel's update pass over the set, then this step's scale gradients from the sums p*g it returns."""
        beta1, beta2 = group["betas"]
        period = group["size_update_period"]
        assert ns.grads is not None
        steps = [self.state[b.params[0]]["step"] for b in ns.buckets]
        alphas, sizes = zip(*(self._row_coefficients(group, b, step, clip) for b, step in zip(ns.buckets, steps)))
        alpha, size = torch.cat(alphas).view(-1), torch.cat(sizes).view(-1)
        step_of_row = [step for b, step in zip(ns.buckets, steps) for _ in b.params]
        kernel, _ = scaled_adam_kernel.kernel()
        dots = torch.empty(len(ns.params), dtype=torch.float64)
        for step in sorted(set(steps)):  # the buckets of a group step together: normally one call
            rows = [i for i, s in enumerate(step_of_row) if s == step]
            bias2 = 1 - beta2 ** (step + 1)
            v_scale = 1 / bias2 if bias2 < 0.99 else 1.0  # icefall drops the correction once it is small
            consts = torch.tensor([clip, beta1, beta2, v_scale, group["eps"]], dtype=torch.float32)
            tensors = (ns.params, ns.grads, ns.deltas, ns.avg_sqs)
            sub = rows if len(rows) < len(step_of_row) else slice(None)
            lists = [[ts[i] for i in rows] for ts in tensors] if isinstance(sub, list) else list(tensors)
            dots[sub] = kernel.update(*lists, alpha[sub].contiguous(), size[sub].contiguous(), consts)
        o = 0
        for b, step in zip(ns.buckets, steps):
            if not b.pg_ready:  # d(loss)/d(log scale) of each tensor for this step, from the clipped gradient
                b.rows["scale_grads"][:, step % period] = dots[o : o + len(b.params)].float() * clip
            o += len(b.params)
            b.clear()
            for p in b.params:
                self.state[p]["step"] = step + 1
        ns.grads = None

    def _row_coefficients(self, group: dict[str, Any], b: _Bucket, step: int, clip: float) -> tuple[Tensor, Tensor]:
        """alpha (main step) and size (learned-scale step), (n, 1), per row of a non-scalar bucket."""
        beta1, beta2 = group["betas"]
        period = group["size_update_period"]
        rms, scale_grads = b.rows["param_rms"], b.rows["scale_grads"]
        assert b.stats is not None
        if b.pg_ready:  # d(loss)/d(log scale) of each tensor for this step, from the clipped gradient
            scale_grads[:, step % period] = b.stats[:, 1] * clip
        size = torch.zeros_like(rms)
        if step % period == period - 1:
            assert b.pg_ready
            rms.copy_((b.stats[:, 2] / b.numel).sqrt())
            if step > 0:
                size = self._scale_step(group, b, step) * (1 - beta1)
        alpha = rms.clamp(min=group["param_min_rms"]) * (-group["lr"] * (1 - beta1))
        return alpha.unsqueeze(1), size.unsqueeze(1)

    @staticmethod
    def _scale_step(group: dict[str, Any], b: _Bucket, step: int) -> Tensor:
        """Adam step on each tensor's log-scale, kept within [param_min_rms, param_max_rms]."""
        _, beta2 = group["betas"]
        rms, scale_grads, avg_sq = b.rows["param_rms"], b.rows["scale_grads"], b.rows["scale_exp_avg_sq"]
        period = scale_grads.shape[1]
        beta2_p = beta2**period  # one size step per period decays faster
        avg_sq.mul_(beta2_p).add_((scale_grads**2).mean(dim=1), alpha=1 - beta2_p)
        bias2 = 1 - beta2_p ** ((step + 1) // period)
        size_lr = group["lr"] * group["scalar_lr_scale"]
        scale_step = scale_grads.sum(dim=1) * (-size_lr * bias2**0.5) / (avg_sq.sqrt() + group["eps"])
        scale_step = scale_step.masked_fill(rms < group["param_min_rms"], 0.0)  # too small: do not shrink
        return torch.minimum(scale_step, (group["param_max_rms"] - rms) / rms)  # never grow past the max

    # ------------------------------------------------------------------ clipping and diagnostics
    def _clip_factor(
        self, gi: int, group: dict[str, Any], buckets: list[_Bucket], first: dict[str, Any], norm: float, norm_t: Tensor
    ) -> float:
        period = group["clipping_update_period"]
        step = first["step"]
        norms = first.get("model_norms")
        if norms is None or norms.numel() != period:
            norms = first["model_norms"] = torch.zeros(period, device=norm_t.device)
        norms[step % period] = norm_t
        irregular = step in IRREGULAR_ESTIMATES and step < period
        if step % period == 0 or irregular:
            ordered = norms.sort().values.cpu()
            if irregular:
                ordered = ordered[-step:]  # the norms recorded so far (steps 1..step)
            k = ordered.numel()
            quartiles = [ordered[min(k - 1, (k // 4) * j)].item() for j in range(5)]
            threshold = group["clipping_scale"] * quartiles[2] * (2.0 if irregular else 1.0)
            first["model_norm_threshold"] = threshold
            clipped = first.get("num_clipped", 0) * 100.0 / k
            first["num_clipped"] = 0
            log.log(
                self._info,
                "ScaledAdam group %d: clipping_scale=%s, grad-norm quartiles %s, threshold=%.3e, percent-clipped=%.1f",
                gi,
                group["clipping_scale"],
                " ".join(f"{q:.3e}" for q in quartiles),
                threshold,
                clipped,
            )
        threshold = first.get("model_norm_threshold")
        if threshold is None:
            return 1.0
        factor = min(1.0, threshold / (norm + 1e-20))
        if factor < 1.0:
            first["num_clipped"] = first.get("num_clipped", 0) + 1
        if factor < 0.1 and log.isEnabledFor(self._warning):  # _dominant reads every tensor's statistics
            log.log(
                self._warning,
                "ScaledAdam group %d: scaling gradients by %.3g, model_norm_threshold=%.3e%s",
                gi,
                factor,
                threshold,
                self._dominant(gi, group, buckets, norm),
            )
        return factor

    def _row_contributions(self, group: dict[str, Any], b: _Bucket) -> Tensor:
        assert b.stats is not None
        weight = group["scalar_lr_scale"] ** 2 if b.scalar else b.rows["param_rms"] ** 2
        return b.stats[:, 0] * weight

    def _dominant(self, gi: int, group: dict[str, Any], buckets: list[_Bucket], norm: float) -> str:
        """', dominated by <name> (...)': the tensor with the largest share of the norm; never raises."""
        try:
            best = max(
                ((c, b, i) for b in buckets for i, c in enumerate(self._row_contributions(group, b).tolist())),
                key=lambda t: t[0],
            )
            share, b, i = best
            gsq = b.stats[i, 0].item()  # type: ignore[index]
            return (
                f", dominated by {self.param_name(gi, b.index[i])} (share {share / max(norm * norm, 1e-30):.2f}"
                f", grad_sumsq={gsq:.3e}, weighted={share:.3e})"
            )
        except Exception as e:  # diagnostics must never stop training
            return f" (no diagnostics: {type(e).__name__})"

    def _report_nonfinite(self, plans: list[tuple[list[_Bucket], _NativeSet | None]], norms: list[float]) -> None:
        self.skipped_steps += 1
        try:
            bad = [
                self.param_name(gi, b.index[i])
                for gi, (buckets, _) in enumerate(plans)
                for b in buckets
                for i, gsq in enumerate(b.stats[:, 0].tolist() if b.stats is not None else [])
                if not math.isfinite(gsq)
            ]
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        except Exception as e:  # diagnostics must never stop training
            shown = f"unknown ({type(e).__name__})"
        log.warning(
            "ScaledAdam: skipped step (non-finite gradient norm %s; skipped so far: %d); non-finite gradients in: %s",
            norms,
            self.skipped_steps,
            shown or "none (norm overflowed)",
        )
        for buckets, native in plans:
            for b in buckets:
                b.clear()
            if native is not None:
                native.grads = None
