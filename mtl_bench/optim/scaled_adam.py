# Source: ScaledAdam of k2-fsa/icefall egs/librispeech/ASR/zipformer/optim.py (Daniel Povey, Apache-2.0); own code.
"""ScaledAdam: Adam whose update for each tensor is scaled by that tensor's RMS and which also learns each
tensor's overall scale; scalars get plain Adam. See docs in `ScaledAdam`.

Layout: parameters of one group are bucketed by (device, dtype, shape). Per-row scalar work (clipping norm,
parameter RMS, scale learning, bias corrections) runs once per bucket on stacked (n,) tensors. A step makes two
passes over memory: `_stats` reads p and g (the clipping norm, the non-finite check and the learned scale need
them before any update), then `_update` reads p, g, delta, exp_avg_sq and writes p, delta, exp_avg_sq, as
fused Adam does. Both take lists of 2-D (rows, elements) tensors: either the whole bucket stacked into one
(small tensors, non-CPU devices) or each tensor's own memory viewed as one row (large CPU tensors, where a
stack copy costs more memory traffic than the update itself), `CHUNK` tensors per call so that one call
(one dispatch, and under torch.compile one C++ kernel streaming several tensors at once) covers several
tensors. The same two functions run eagerly or through torch.compile.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Union

import torch
from torch import Tensor

log = logging.getLogger(__name__)

CompileMode = Union[bool, Literal["auto"]]

# compile="auto" compiles when the non-scalar parameters hold at least this many elements: a compile costs
# seconds once and saves a memory pass or more per element per step.
AUTO_COMPILE_MIN_NUMEL = 1 << 20
# On CPU, tensors up to this many elements are stacked per bucket; larger ones are updated in place.
STACK_MAX_NUMEL = 1 << 16
# Large same-shape tensors handed to one call of `_stats` / `_update` (a bucket's remainder goes one by one,
# so the compiled graphs are: CHUNK rows, one row, one stacked bucket).
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


# ------------------------------------------------------------------ the CPU kernel
# torch.compile cannot give the update pass the scale gradient sum(p*g): inductor will not fuse a reduction over
# p with the loop that overwrites p (it schedules the reduction as a second pass, or writes p through a copy),
# so its statistics pass reads p and g. This C kernel does: its statistics pass reads g alone (p too every
# `size_update_period`-th step, for the RMS and the scale step), and its update pass returns sum(p*g) from the
# same loop as fused Adam's. Float32 CPU tensors only; built at first use with the C compiler and OpenMP that
# inductor uses; anything else, or a failed build, goes through torch.compile.
_NATIVE_SRC = r"""
#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
#endif

/* Thread t's part of [0, n), in blocks of 64 elements: fixed for a thread count, so results are too. */
static void part(int64_t n, int t, int T, int64_t* lo, int64_t* hi) {
    int64_t blocks = (n + 63) / 64, per = blocks / T, extra = blocks % T;
    int64_t b0 = t * per + (t < extra ? t : extra), b1 = b0 + per + (t < extra ? 1 : 0);
    *lo = b0 * 64 < n ? b0 * 64 : n;
    *hi = b1 * 64 < n ? b1 * 64 : n;
}

/* out[3i..3i+2] = sum g^2, sum p*g, sum p^2 of tensor i (the last two only when full). Float products summed in
   double, like (g * g).sum(dtype=float64). A thread reads its range as four quarters at once: more loads in
   flight than one stream. partial holds n * T * 3 doubles. */
void mtl_sa_stats(int n, const float** ps, const float** gs, const int64_t* numels, int full, int T,
                  double* partial, double* out) {
    #pragma omp parallel num_threads(T)
    {
        int t = omp_get_thread_num();
        for (int i = 0; i < n; i++) {
            int64_t lo, hi, j;
            part(numels[i], t, T, &lo, &hi);
            const float *g = gs[i], *p = ps[i];
            int64_t q = (hi - lo) / 4;
            const float *g0 = g + lo, *g1 = g0 + q, *g2 = g1 + q, *g3 = g2 + q;
            double a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0;
            if (full) {
                const float *p0 = p + lo, *p1 = p0 + q, *p2 = p1 + q, *p3 = p2 + q;
                #pragma omp simd reduction(+:a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3)
                for (j = 0; j < q; j++) {
                    a0 += (double)(g0[j] * g0[j]); a1 += (double)(g1[j] * g1[j]);
                    a2 += (double)(g2[j] * g2[j]); a3 += (double)(g3[j] * g3[j]);
                    b0 += (double)(p0[j] * g0[j]); b1 += (double)(p1[j] * g1[j]);
                    b2 += (double)(p2[j] * g2[j]); b3 += (double)(p3[j] * g3[j]);
                    c0 += (double)(p0[j] * p0[j]); c1 += (double)(p1[j] * p1[j]);
                    c2 += (double)(p2[j] * p2[j]); c3 += (double)(p3[j] * p3[j]);
                }
                for (j = lo + 4 * q; j < hi; j++) {
                    a0 += (double)(g[j] * g[j]); b0 += (double)(p[j] * g[j]); c0 += (double)(p[j] * p[j]);
                }
            } else {
                #pragma omp simd reduction(+:a0, a1, a2, a3)
                for (j = 0; j < q; j++) {
                    a0 += (double)(g0[j] * g0[j]); a1 += (double)(g1[j] * g1[j]);
                    a2 += (double)(g2[j] * g2[j]); a3 += (double)(g3[j] * g3[j]);
                }
                for (j = lo + 4 * q; j < hi; j++) a0 += (double)(g[j] * g[j]);
            }
            double* r = partial + ((int64_t)i * T + t) * 3;
            r[0] = (a0 + a1) + (a2 + a3); r[1] = (b0 + b1) + (b2 + b3); r[2] = (c0 + c1) + (c2 + c3);
        }
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) {
            double s = 0;
            for (int t = 0; t < T; t++) s += partial[((int64_t)i * T + t) * 3 + k];
            out[3 * i + k] = s;
        }
}

/* _update for tensor i with alpha[i], size[i]; c = [clip, beta1, beta2, exp_avg_sq scale, eps]; dots[i] = sum
   p*g over the values before the update. partial holds n * T doubles. */
void mtl_sa_update(int n, float** ps, const float** gs, float** ds, float** vs, const int64_t* numels,
                   const float* alpha, const float* size, const float* c, int T, double* partial, double* dots) {
    const float clip = c[0], beta1 = c[1], beta2 = c[2], vscale = c[3], eps = c[4], one_minus_beta2 = 1.0f - beta2;
    #pragma omp parallel num_threads(T)
    {
        int t = omp_get_thread_num();
        for (int i = 0; i < n; i++) {
            int64_t lo, hi, j;
            part(numels[i], t, T, &lo, &hi);
            float *p = ps[i], *d = ds[i], *v = vs[i];
            const float* g = gs[i];
            const float a = alpha[i], sz = size[i];
            double dot = 0;
            #pragma omp simd reduction(+:dot)
            for (j = lo; j < hi; j++) {
                float pj = p[j], gj = g[j];
                dot += (double)(pj * gj);
                float gc = gj * clip;
                float vj = v[j] * beta2 + gc * (gc * one_minus_beta2);
                v[j] = vj;
                float dj = d[j] * beta1 + pj * sz + gc / (sqrtf(vj * vscale) + eps) * a;
                d[j] = dj;
                p[j] = pj + dj;
            }
            partial[(int64_t)i * T + t] = dot;
        }
    }
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int t = 0; t < T; t++) s += partial[(int64_t)i * T + t];
        dots[i] = s;
    }
}
"""
_NATIVE_FLAGS = (
    ["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"],
    ["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-shared", "-fPIC"],
)
_native_lib: Any = None  # the loaded kernel; False once building it has failed


def _native_kernels() -> Any:
    """The C kernel as a ctypes library, built into a per-user cache directory at first use; None if that fails."""
    global _native_lib
    if _native_lib is None:
        try:
            _native_lib = _build_native()
        except Exception as e:  # no compiler, no OpenMP, read-only temp: the torch.compile path serves
            log.info("ScaledAdam: no CPU kernel (%s: %s); using torch.compile", type(e).__name__, e)
            _native_lib = False
    return _native_lib or None


def _build_native() -> Any:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler on PATH")
    cpu = platform.machine()
    try:  # -march=native: a build is only good for this CPU
        with open("/proc/cpuinfo") as f:
            cpu += "".join(line for line in f if line.startswith(("model name", "flags")))[:4096]
    except OSError:
        cpu += platform.processor()
    uid = os.getuid() if hasattr(os, "getuid") else 0
    cache = Path(tempfile.gettempdir()) / f"mtl_bench_{uid}"
    cache.mkdir(mode=0o700, exist_ok=True)
    if hasattr(os, "getuid") and cache.stat().st_uid != uid:
        raise RuntimeError(f"{cache} belongs to another user")
    errors = []
    for flags in _NATIVE_FLAGS:
        key = hashlib.sha256("\0".join([_NATIVE_SRC, cc, *flags, cpu]).encode()).hexdigest()[:20]
        lib_path = cache / f"scaled_adam_{key}.so"
        if not lib_path.exists():
            src = cache / f"scaled_adam_{key}.{os.getpid()}.c"
            src.write_text(_NATIVE_SRC)
            tmp = lib_path.with_suffix(f".{os.getpid()}.tmp")
            try:
                done = subprocess.run(
                    [cc, *flags, str(src), "-o", str(tmp)], capture_output=True, text=True, timeout=300
                )
                if done.returncode != 0:
                    errors.append(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else cc)
                    continue
                os.replace(tmp, lib_path)  # atomic: a concurrent process sees the whole library or none
            finally:
                src.unlink(missing_ok=True)
                tmp.unlink(missing_ok=True)
        lib = ctypes.CDLL(str(lib_path))
        ptr, num = ctypes.c_void_p, ctypes.c_int  # every array goes as its address
        lib.mtl_sa_stats.argtypes = [num, ptr, ptr, ptr, num, num, ptr, ptr]
        lib.mtl_sa_stats.restype = None
        lib.mtl_sa_update.argtypes = [num, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, num, ptr, ptr]
        lib.mtl_sa_update.restype = None
        return lib
    raise RuntimeError("; ".join(errors) or "build failed")


def _array(ctype: Any, values: list[int]) -> Any:
    return (ctype * len(values))(*values)


def _own(t: Tensor) -> Tensor:
    """`t` if it is contiguous and owns its memory, else a contiguous copy."""
    return t if t._base is None and t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)


def should_compile(mode: CompileMode, numel: int) -> bool:
    """True/False as given; "auto": dynamo supports this Python and `numel` (elements in tensors with more
    than one element) reaches AUTO_COMPILE_MIN_NUMEL. A failing compiler is caught at the first call."""
    if mode != "auto":
        return bool(mode)
    return numel >= AUTO_COMPILE_MIN_NUMEL and torch._dynamo.is_dynamo_supported()


_compiled: dict[str, Callable[..., Any]] = {}


def _compiled_fns() -> tuple[Callable[..., Tensor], Callable[..., None]]:
    # Shared by all instances; dynamic shapes so one graph serves every row length (rows=1 specialises once).
    if not _compiled:
        _compiled["stats"] = torch.compile(_stats, dynamic=True)
        _compiled["update"] = torch.compile(_update, dynamic=True)
    return _compiled["stats"], _compiled["update"]


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
    pg_ready: bool = True  # stats[:, 1] holds this step's sum p*g (the C kernel's update pass returns it)
    calls: list[tuple[int, int]] = field(default_factory=list)  # `chunks()`, fixed with the plan
    native: bool = False  # stepped by the C kernel (per-tensor layout)

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
    """The buckets of one group that the C kernel steps: each pass is one call over all their tensors."""

    buckets: list[_Bucket]
    params: list[Tensor]
    numels: list[int]
    state: list[Tensor]  # each tensor's delta and exp_avg_sq: held here, so the addresses below stay valid
    deltas: list[int]
    avg_sqs: list[int]
    grads: list[Tensor] | None = None  # this step's float32 contiguous gradients, alive across both passes

    def valid(self) -> bool:
        """The parameters still are what the plan saw (the kernel writes through their raw memory)."""
        return all(
            p.dtype == torch.float32 and p.device.type == "cpu" and p.is_contiguous() and p.numel() == b.numel
            for b in self.buckets
            for p in b.params
        )


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
    clipping factor depend on it). Compiled means: float32 tensors on CPU through a C kernel built at first use
    (see `_NATIVE_SRC`), everything else, or everything when that build fails, through torch.compile.
    `compile="auto"` compiles when the non-scalar tensors hold at least AUTO_COMPILE_MIN_NUMEL elements and falls
    back to eager, with a warning, if torch.compile fails.
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
        compile: CompileMode = "auto",
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
        compile: True: compiled kernels, errors raise; False: eager, same math; "auto": compiled from 2^20 elements.
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
        if compile not in ("auto", True, False) or not isinstance(compile, (bool, str)):
            raise ValueError(f"compile: must be 'auto', True or False, got {compile!r}")
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
        self.compile = compile
        self.stack_max_numel = STACK_MAX_NUMEL  # tests and benchmarks change it to force a layout
        self.use_native = True  # tests and benchmarks turn the C kernel off to time or check torch.compile alone
        self.skipped_steps = 0
        self._plans: list[tuple[tuple[int, ...], list[_Bucket], _NativeSet | None]] | None = None
        self._use_compiled: bool | None = None  # decided at the first step
        self._native: bool | None = None  # likewise
        super().__init__(params, defaults)

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
            buckets = self._build_buckets(group)
            plan = (key, buckets, self._native_set(buckets))
            self._plans[gi] = plan
        return plan[1], plan[2]

    def _build_buckets(self, group: dict[str, Any]) -> list[_Bucket]:
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
            b.native = (
                bool(self._native)
                and not b.scalar
                and dev.type == "cpu"
                and contiguous
                and (b.params[0].dtype == torch.float32)
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
            # layout keeps each tensor's delta and exp_avg_sq apart: `_update` mutates them in place, and views
            # of one storage handed to a compiled function in one call would alias (copies, not a fused loop).
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
        return _NativeSet(
            mine,
            params,
            [p.numel() for p in params],
            deltas + avg_sqs,
            [t.data_ptr() for t in deltas],
            [t.data_ptr() for t in avg_sqs],
        )

    @staticmethod
    def _init_state(group: dict[str, Any], p: Tensor, st: dict[str, Any]) -> None:
        st["step"] = 0
        st["delta"] = torch.zeros(p.shape, device=p.device, dtype=torch.float32)
        st["exp_avg_sq"] = torch.zeros(p.shape, device=p.device, dtype=torch.float32)
        if p.numel() > 1:
            st["param_rms"] = p.detach().float().pow(2).mean().sqrt()
            st["scale_exp_avg_sq"] = torch.zeros((), device=p.device)
            st["scale_grads"] = torch.zeros(group["size_update_period"], device=p.device)

    def _decide_compile(self) -> None:
        """At the first step: compiled or eager, and whether the C kernel takes the float32 CPU tensors."""
        tensors = [p for g in self.param_groups for p in g["params"] if p.numel() > 1]
        self._use_compiled = should_compile(self.compile, sum(p.numel() for p in tensors))
        wanted = (
            self._use_compiled
            and self.use_native
            and any(p.device.type == "cpu" and p.dtype == torch.float32 for p in tensors)
        )
        self._native = bool(wanted and _native_kernels() is not None)
        self._plans = None  # lay the buckets out for that choice

    @property
    def compiled(self) -> bool:
        """Whether the update runs through compiled kernels (decided at the first step)."""
        return bool(self._use_compiled)

    @property
    def native(self) -> bool:
        """Whether float32 CPU tensors go through the C kernel (decided at the first step)."""
        return bool(self._native)

    def _call(self, which: int, *args: Any, eager: bool = False) -> Any:
        fn = (_compiled_fns() if self._use_compiled and not eager else (_stats, _update))[which]
        try:
            return fn(*args)
        except Exception as e:  # a compile failure happens before the call mutates anything
            if not self._use_compiled or self.compile is True:
                raise
            log.warning(
                "ScaledAdam: torch.compile failed (%s: %s); using the eager update",
                type(e).__name__,
                str(e).splitlines()[0] if str(e) else "",
            )
            self._use_compiled = False
            return (_stats, _update)[which](*args)

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._use_compiled is None:
            self._decide_compile()
        plans = [self._plan(gi, g) for gi, g in enumerate(self.param_groups)]
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
            # next to the C kernel only the scalars are left: eager costs them as little as a compiled call
            eager = b.scalar and bool(self._native)
            parts = [self._call(0, b.ps[i:j], b.gs[i:j], eager=eager) for i, j in b.calls]
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
                eager=b.scalar and bool(self._native),
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
        """The C kernel's statistics pass: sum g^2 of every tensor; sum p*g and sum p^2 too when a bucket refreshes
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
        n, threads = len(ns.params), torch.get_num_threads()
        out = torch.empty(n, 3, dtype=torch.float64)
        partial = torch.empty(n * threads * 3, dtype=torch.float64)
        ps = _array(ctypes.c_void_p, [p.data_ptr() for p in ns.params])
        gs = _array(ctypes.c_void_p, [g.data_ptr() for g in grads])
        numels = _array(ctypes.c_int64, ns.numels)
        _native_kernels().mtl_sa_stats(
            n,
            ctypes.addressof(ps),
            ctypes.addressof(gs),
            ctypes.addressof(numels),
            int(full),
            threads,
            partial.data_ptr(),
            out.data_ptr(),
        )
        stats, o = out.float(), 0
        for b in ns.buckets:
            b.stats, b.pg_ready = stats[o : o + len(b.params)], full
            o += len(b.params)
        ns.grads = grads

    def _update_native(self, group: dict[str, Any], ns: _NativeSet, clip: float) -> None:
        """The C kernel's update pass over the set, then this step's scale gradients from the sums p*g it returns."""
        beta1, beta2 = group["betas"]
        period = group["size_update_period"]
        assert ns.grads is not None
        steps = [self.state[b.params[0]]["step"] for b in ns.buckets]
        alphas, sizes = zip(*(self._row_coefficients(group, b, step, clip) for b, step in zip(ns.buckets, steps)))
        alpha, size = torch.cat(alphas).view(-1), torch.cat(sizes).view(-1)
        step_of_row = [step for b, step in zip(ns.buckets, steps) for _ in b.params]
        p_ptrs, g_ptrs = [p.data_ptr() for p in ns.params], [g.data_ptr() for g in ns.grads]
        threads = torch.get_num_threads()
        dots = torch.empty(len(ns.params), dtype=torch.float64)
        for step in sorted(set(steps)):  # the buckets of a group step together: normally one call
            rows = [i for i, s in enumerate(step_of_row) if s == step]
            bias2 = 1 - beta2 ** (step + 1)
            v_scale = 1 / bias2 if bias2 < 0.99 else 1.0  # icefall drops the correction once it is small
            consts = torch.tensor([clip, beta1, beta2, v_scale, group["eps"]], dtype=torch.float32)
            arrays = [
                _array(ctypes.c_void_p, [ptrs[i] for i in rows]) for ptrs in (p_ptrs, g_ptrs, ns.deltas, ns.avg_sqs)
            ]
            numels = _array(ctypes.c_int64, [ns.numels[i] for i in rows])
            sub = rows if len(rows) < len(step_of_row) else slice(None)
            out = torch.empty(len(rows), dtype=torch.float64)
            partial = torch.empty(len(rows) * threads, dtype=torch.float64)
            a, z = alpha[sub].contiguous(), size[sub].contiguous()
            _native_kernels().mtl_sa_update(
                len(rows),
                *map(ctypes.addressof, arrays),
                ctypes.addressof(numels),
                a.data_ptr(),
                z.data_ptr(),
                consts.data_ptr(),
                threads,
                partial.data_ptr(),
                out.data_ptr(),
            )
            dots[sub] = out
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
            log.info(
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
        if factor < 0.1:
            log.warning(
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
                for i, gsq in enumerate(b.stats[:, 0].tolist())
                if not math.isfinite(gsq)
            ]  # type: ignore[index]
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
