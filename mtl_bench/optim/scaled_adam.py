# Source: ScaledAdam of k2-fsa/icefall egs/librispeech/ASR/zipformer/optim.py (Daniel Povey, Apache-2.0); own code.
"""ScaledAdam: Adam whose update for each tensor is scaled by that tensor's RMS and which also learns each
tensor's overall scale; scalars get plain Adam. See docs in `ScaledAdam`.

Layout: parameters of one group are bucketed by (device, dtype, shape). Per-row scalar work (clipping norm,
parameter RMS, scale learning, bias corrections) runs once per bucket on stacked (n,) tensors. The
element-wise update runs as one pass over a 2-D (rows, elements) view: either the whole bucket stacked
(small tensors, non-CPU devices) or one row per tensor on the parameter's own memory (large CPU tensors,
where copying into a stack costs more memory traffic than the update itself). The same two functions
(`_row_stats`, `_row_update`) serve both layouts, eager or through torch.compile.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from itertools import chain
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
# Steps at which a first clipping threshold is estimated (2x looser), besides multiples of the period.
IRREGULAR_ESTIMATES = (10, 20, 40)


def _row_stats(p: Tensor, g: Tensor) -> Tensor:
    """For (n, m) rows: float32 (n, 3) of [sum g^2, sum p*g, sum p^2] per row."""
    p, g = p.float(), g.float()
    return torch.stack(((g * g).sum(1), (p * g).sum(1), (p * p).sum(1)), dim=1)


def _row_update(p: Tensor, g: Tensor, delta: Tensor, exp_avg_sq: Tensor, rows: Tensor, consts: Tensor) -> None:
    """One pass over (n, m) rows, in place on p, delta and exp_avg_sq (float32).

    rows (n, 2): [alpha, size] per row; consts (5,): [clip, beta1, beta2, exp_avg_sq scale, eps].
    v <- beta2*v + (1-beta2)*g'^2;  delta <- beta1*delta + size*p + alpha*g'/(sqrt(v*scale)+eps);  p <- p + delta,
    with g' = clip*g. In-place ops keep the eager path to two temporaries; compiled, it is one loop.
    """
    clip, beta1, beta2, v_scale, eps = consts.unbind()
    g32 = g.float() * clip
    exp_avg_sq.mul_(beta2).addcmul_(g32, g32 * (1 - beta2))
    step = g32.div_((exp_avg_sq * v_scale).sqrt_().add_(eps))
    delta.mul_(beta1).addcmul_(p.float(), rows[:, 1:2]).addcmul_(step, rows[:, 0:1])
    p.add_(delta)


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
        _compiled["stats"] = torch.compile(_row_stats, dynamic=True)
        _compiled["update"] = torch.compile(_row_update, dynamic=True)
    return _compiled["stats"], _compiled["update"]


@dataclass
class _Bucket:
    params: list[Tensor]
    index: list[int]  # positions in the group, for names
    numel: int  # elements per tensor
    stacked: bool
    rows: dict[str, Tensor] = field(default_factory=dict)  # stacked state: param_rms, scale_* (n,), delta...
    # this step's inputs: stacked params/grads (stacked layout) or the gradients (per-tensor layout)
    p2: Tensor | None = None
    g2: Tensor | None = None
    grads: list[Tensor] | None = None
    stats: Tensor | None = None  # this step's (n, 3) row stats

    def clear(self) -> None:
        self.p2 = self.g2 = self.grads = self.stats = None

    @property
    def scalar(self) -> bool:
        return self.numel == 1


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

    `params`: tensors, `named_parameters()`, or groups (`params` of tensors or (name, tensor) pairs, or
    icefall's `named_params`). Names only label diagnostics. State is float32 for any parameter dtype.
    `compile`: True compiles the update with torch.compile (errors raise); False runs it eagerly (same math);
    "auto" compiles when the non-scalar parameters hold >= AUTO_COMPILE_MIN_NUMEL elements and falls back to
    eager, with a warning, if compiling fails.
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
        """
        params: the parameters or parameter groups (given by the engine).
        lr: the learning rate (>= 0); the zipformer recipe uses 0.045.
        clipping_scale: clip to this times the median recent gradient norm; None: no clipping.
        betas: Adam's betas, 0 < beta1 <= beta2 < 1.
        scalar_lr_scale: the learning rate of scalars and of each tensor's scale, relative to lr.
        eps: Adam's eps.
        param_min_rms: the smallest RMS a tensor's update is scaled by, and its scale's floor.
        param_max_rms: the largest RMS a tensor's scale may grow to.
        scalar_max: scalars are clamped to +-scalar_max after the update.
        size_update_period: steps between refreshes of each tensor's RMS and scale steps.
        clipping_update_period: steps between refreshes of the clipping threshold.
        compile: True, False or "auto": run the update through torch.compile.
        """
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not 0 < betas[0] <= betas[1] < 1:
            raise ValueError(f"betas must satisfy 0 < beta1 <= beta2 < 1, got {betas}")
        if clipping_scale is not None and clipping_scale <= 0:
            raise ValueError(f"clipping_scale must be > 0 or None, got {clipping_scale}")
        if size_update_period < 1 or clipping_update_period < 1:
            raise ValueError("size_update_period and clipping_update_period must be >= 1")
        if compile not in ("auto", True, False):
            raise ValueError(f"compile must be 'auto', True or False, got {compile!r}")
        defaults = dict(lr=lr, clipping_scale=clipping_scale, betas=tuple(betas), scalar_lr_scale=scalar_lr_scale,
                        eps=eps, param_min_rms=param_min_rms, param_max_rms=param_max_rms, scalar_max=scalar_max,
                        size_update_period=size_update_period, clipping_update_period=clipping_update_period)
        self.compile = compile
        self.stack_max_numel = STACK_MAX_NUMEL  # tests and benchmarks change it to force a layout
        self.skipped_steps = 0
        self._plans: list[tuple[tuple[int, ...], list[_Bucket]]] | None = None
        self._use_compiled: bool | None = None  # decided at the first step
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
    def _buckets(self, gi: int, group: dict[str, Any]) -> list[_Bucket]:
        key = tuple(id(p) for p in group["params"])
        if self._plans is None:
            self._plans = [None] * len(self.param_groups)  # type: ignore[list-item]
        plan = self._plans[gi]
        if plan is None or plan[0] != key:
            plan = (key, self._build_buckets(group))
            self._plans[gi] = plan
        return plan[1]

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
            b.stacked = (b.scalar or b.numel <= self.stack_max_numel or dev.type != "cpu"
                         or not all(p.is_contiguous() for p in b.params))
            states = [self.state[p] for p in b.params]
            for p, st in zip(b.params, states):
                if not st:
                    self._init_state(group, p, st)
            step = states[0]["step"]
            for st in states:  # one counter per bucket; members always step together
                st["step"] = step
            # Stack the per-row state once and make each parameter's state a view of it, so the state_dict
            # keeps torch's per-parameter format while a step touches one tensor per bucket.
            names = ["delta", "exp_avg_sq"] if b.stacked else []
            if not b.stacked:  # the update writes through views of these
                for st in states:
                    st["delta"], st["exp_avg_sq"] = st["delta"].contiguous(), st["exp_avg_sq"].contiguous()
            if not b.scalar:
                names += ["param_rms", "scale_exp_avg_sq", "scale_grads"]
            for name in names:
                stack = torch.stack([st[name].reshape(-1) if name in ("delta", "exp_avg_sq") else st[name]
                                     for st in states]).to(device=dev, dtype=torch.float32)
                b.rows[name] = stack
                for i, (p, st) in enumerate(zip(b.params, states)):
                    st[name] = stack[i].view(p.shape) if name in ("delta", "exp_avg_sq") else stack[i]
        return buckets

    @staticmethod
    def _init_state(group: dict[str, Any], p: Tensor, st: dict[str, Any]) -> None:
        st["step"] = 0
        st["delta"] = torch.zeros(p.shape, device=p.device, dtype=torch.float32)
        st["exp_avg_sq"] = torch.zeros(p.shape, device=p.device, dtype=torch.float32)
        if p.numel() > 1:
            st["param_rms"] = p.detach().float().pow(2).mean().sqrt()
            st["scale_exp_avg_sq"] = torch.zeros((), device=p.device)
            st["scale_grads"] = torch.zeros(group["size_update_period"], device=p.device)

    def _decide_compile(self, plans: list[list[_Bucket]]) -> None:
        if self._use_compiled is None:
            numel = sum(b.numel * len(b.params) for bs in plans for b in bs if not b.scalar)
            self._use_compiled = should_compile(self.compile, numel)

    @property
    def compiled(self) -> bool:
        """Whether the update runs through torch.compile (decided at the first step)."""
        return bool(self._use_compiled)

    def _call(self, which: int, *args: Tensor) -> Any:
        fn = (_compiled_fns() if self._use_compiled else (_row_stats, _row_update))[which]
        try:
            return fn(*args)
        except Exception as e:  # a compile failure happens before the call mutates anything
            if not self._use_compiled or self.compile is True:
                raise
            log.warning("ScaledAdam: torch.compile failed (%s: %s); using the eager update",
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            self._use_compiled = False
            return (_row_stats, _row_update)[which](*args)

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plans = [self._buckets(gi, g) for gi, g in enumerate(self.param_groups)]
        self._decide_compile(plans)
        norms = [self._group_stats(g, buckets) for g, buckets in zip(self.param_groups, plans)]
        if not any(plans):
            return loss
        dev = next(p.device for g in self.param_groups for p in g["params"])
        # The one host read per step: the skip and the clipping factor depend on it.
        host_norms = torch.stack([n.to(dev) for n in norms]).tolist()
        if not all(math.isfinite(n) for n in host_norms):
            self._report_nonfinite(plans, host_norms)
            return loss
        for gi, (group, buckets) in enumerate(zip(self.param_groups, plans)):
            if not buckets:
                continue
            first = self.state[group["params"][0]]
            clip = 1.0
            if group["clipping_scale"] is not None and first["step"] > 0:
                clip = self._clip_factor(gi, group, buckets, first, host_norms[gi], norms[gi])
            for b in buckets:
                self._update_bucket(group, b, clip)
        return loss

    def _group_stats(self, group: dict[str, Any], buckets: list[_Bucket]) -> Tensor:
        """Row stats of every bucket (kept on the bucket) and the group's RMS-weighted gradient norm."""
        sumsq = [torch.zeros((), device=group["params"][0].device)] if group["params"] else [torch.zeros(())]
        for b in buckets:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in b.params]
            if b.stacked:
                b.p2 = torch.stack([p.detach().reshape(-1) for p in b.params])
                b.g2 = torch.stack([g.reshape(-1) for g in grads])
                b.stats = self._call(0, b.p2, b.g2)
            else:
                b.grads = grads
                b.stats = torch.cat([self._call(0, p.detach().view(1, -1), g.reshape(1, -1))
                                     for p, g in zip(b.params, grads)])
            weight = group["scalar_lr_scale"] ** 2 if b.scalar else b.rows["param_rms"] ** 2
            sumsq.append((b.stats[:, 0] * weight).sum())
        return torch.stack(sumsq).sum().sqrt()

    def _update_bucket(self, group: dict[str, Any], b: _Bucket, clip: float) -> None:
        beta1, beta2 = group["betas"]
        states = [self.state[p] for p in b.params]
        step = states[0]["step"]
        dev = b.stats.device
        n = len(b.params)
        bias2 = 1 - beta2 ** (step + 1)
        if b.scalar:
            alpha = torch.full((n,), -group["lr"] * group["scalar_lr_scale"] * (1 - beta1), device=dev)
            size = torch.zeros(n, device=dev)
            v_scale = 1 / bias2
        else:
            alpha, size = self._row_coefficients(group, b, step, clip)
            v_scale = 1 / bias2 if bias2 < 0.99 else 1.0  # icefall drops the correction once it is small
        rows = torch.stack((alpha, size), dim=1)
        consts = torch.tensor([clip, beta1, beta2, v_scale, group["eps"]], device=dev)
        if b.stacked:
            assert b.p2 is not None and b.g2 is not None
            self._call(1, b.p2, b.g2, b.rows["delta"], b.rows["exp_avg_sq"], rows, consts)
            if b.scalar:  # after the update, as upstream intends
                b.p2.clamp_(-group["scalar_max"], group["scalar_max"])
            torch._foreach_copy_([p.detach() for p in b.params], [r.view(p.shape) for r, p in zip(b.p2, b.params)])
        else:
            assert b.grads is not None
            for i, (p, g, st) in enumerate(zip(b.params, b.grads, states)):
                self._call(1, p.detach().view(1, -1), g.reshape(1, -1), st["delta"].view(1, -1),
                           st["exp_avg_sq"].view(1, -1), rows[i:i + 1], consts)
        b.clear()
        for st in states:
            st["step"] = step + 1

    def _row_coefficients(self, group: dict[str, Any], b: _Bucket, step: int, clip: float) -> tuple[Tensor, Tensor]:
        """alpha (main step) and size (learned-scale step) per row of a non-scalar bucket."""
        beta1, beta2 = group["betas"]
        period = group["size_update_period"]
        rms, scale_grads = b.rows["param_rms"], b.rows["scale_grads"]
        assert b.stats is not None
        # d(loss)/d(log scale) of each tensor for this step, from the clipped gradient.
        scale_grads[:, step % period] = b.stats[:, 1] * clip
        size = torch.zeros_like(rms)
        if step % period == period - 1:
            rms.copy_((b.stats[:, 2] / b.numel).sqrt())
            if step > 0:
                size = self._scale_step(group, b, step) * (1 - beta1)
        alpha = rms.clamp(min=group["param_min_rms"]) * (-group["lr"] * (1 - beta1))
        return alpha, size

    @staticmethod
    def _scale_step(group: dict[str, Any], b: _Bucket, step: int) -> Tensor:
        """Adam step on each tensor's log-scale, kept within [param_min_rms, param_max_rms]."""
        _, beta2 = group["betas"]
        rms, scale_grads, avg_sq = b.rows["param_rms"], b.rows["scale_grads"], b.rows["scale_exp_avg_sq"]
        period = scale_grads.shape[1]
        beta2_p = beta2 ** period  # one size step per period decays faster
        avg_sq.mul_(beta2_p).add_((scale_grads ** 2).mean(dim=1), alpha=1 - beta2_p)
        bias2 = 1 - beta2_p ** ((step + 1) // period)
        size_lr = group["lr"] * group["scalar_lr_scale"]
        scale_step = scale_grads.sum(dim=1) * (-size_lr * bias2 ** 0.5) / (avg_sq.sqrt() + group["eps"])
        scale_step = scale_step.masked_fill(rms < group["param_min_rms"], 0.0)  # too small: do not shrink
        return torch.minimum(scale_step, (group["param_max_rms"] - rms) / rms)  # never grow past the max

    # ------------------------------------------------------------------ clipping and diagnostics
    def _clip_factor(self, gi: int, group: dict[str, Any], buckets: list[_Bucket], first: dict[str, Any],
                     norm: float, norm_t: Tensor) -> float:
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
            log.info("ScaledAdam group %d: clipping_scale=%s, grad-norm quartiles %s, threshold=%.3e, "
                     "percent-clipped=%.1f", gi, group["clipping_scale"],
                     " ".join(f"{q:.3e}" for q in quartiles), threshold, clipped)
        threshold = first.get("model_norm_threshold")
        if threshold is None:
            return 1.0
        factor = min(1.0, threshold / (norm + 1e-20))
        if factor < 1.0:
            first["num_clipped"] = first.get("num_clipped", 0) + 1
        if factor < 0.1:
            log.warning("ScaledAdam group %d: scaling gradients by %.3g, model_norm_threshold=%.3e%s", gi, factor,
                        threshold, self._dominant(gi, group, buckets, norm))
        return factor

    def _row_contributions(self, group: dict[str, Any], b: _Bucket) -> Tensor:
        assert b.stats is not None
        weight = group["scalar_lr_scale"] ** 2 if b.scalar else b.rows["param_rms"] ** 2
        return b.stats[:, 0] * weight

    def _dominant(self, gi: int, group: dict[str, Any], buckets: list[_Bucket], norm: float) -> str:
        """', dominated by <name> (...)': the tensor with the largest share of the norm; never raises."""
        try:
            best = max(((c, b, i) for b in buckets
                        for i, c in enumerate(self._row_contributions(group, b).tolist())), key=lambda t: t[0])
            share, b, i = best
            gsq = b.stats[i, 0].item()  # type: ignore[index]
            return (f", dominated by {self.param_name(gi, b.index[i])} (share {share / max(norm * norm, 1e-30):.2f}"
                    f", grad_sumsq={gsq:.3e}, weighted={share:.3e})")
        except Exception as e:  # diagnostics must never stop training
            return f" (no diagnostics: {type(e).__name__})"

    def _report_nonfinite(self, plans: list[list[_Bucket]], norms: list[float]) -> None:
        self.skipped_steps += 1
        try:
            bad = [self.param_name(gi, b.index[i]) for gi, buckets in enumerate(plans) for b in buckets
                   for i, gsq in enumerate(b.stats[:, 0].tolist()) if not math.isfinite(gsq)]  # type: ignore[index]
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        except Exception as e:  # diagnostics must never stop training
            shown = f"unknown ({type(e).__name__})"
        log.warning("ScaledAdam: skipped step (non-finite gradient norm %s; skipped so far: %d); "
                    "non-finite gradients in: %s", norms, self.skipped_steps, shown or "none (norm overflowed)")
        for buckets in plans:
            for b in buckets:
                b.clear()
