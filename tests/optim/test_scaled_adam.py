"""ScaledAdam against hand-computed values and a plain per-parameter reference of icefall's algorithm."""

from __future__ import annotations

import copy
import inspect
import io
import logging
import math

import pytest
import torch

from mtl_bench.errors import ConfigError
from mtl_bench.optim import ScaledAdam, scaled_adam_kernel
from mtl_bench.optim.scaled_adam import AUTO_KERNEL_MIN_NUMEL, CHUNK, EAGER, KERNEL

BETAS = (0.9, 0.98)


class Reference:
    """icefall's ScaledAdam written as a plain loop over parameters (float32 state, scalar clamp after the
    update), the yardstick for the batched/compiled implementation."""

    def __init__(
        self,
        params,
        lr=3e-2,
        clipping_scale=None,
        scalar_lr_scale=0.1,
        eps=1e-8,
        param_min_rms=1e-5,
        param_max_rms=3.0,
        scalar_max=10.0,
        size_update_period=4,
        clipping_update_period=100,
    ):
        self.params = list(params)
        self.h = dict(
            lr=lr,
            clip=clipping_scale,
            sls=scalar_lr_scale,
            eps=eps,
            min_rms=param_min_rms,
            max_rms=param_max_rms,
            smax=scalar_max,
            P=size_update_period,
            C=clipping_update_period,
        )
        self.st = [
            dict(
                delta=torch.zeros_like(p),
                v=torch.zeros_like(p),
                rms=p.detach().pow(2).mean().sqrt(),
                sv=torch.tensor(0.0),
                sg=torch.zeros(size_update_period),
            )
            for p in self.params
        ]
        self.step_no = 0
        self.norms = torch.zeros(clipping_update_period)
        self.threshold = None

    def clip_factor(self) -> float:
        h, s = self.h, self.step_no
        if h["clip"] is None or s == 0:
            return 1.0
        sumsq = sum(
            float((p.grad**2).sum()) * (h["sls"] ** 2 if p.numel() == 1 else float(st["rms"]) ** 2)
            for p, st in zip(self.params, self.st)
        )
        norm = math.sqrt(sumsq)
        self.norms[s % h["C"]] = norm
        irregular = s in (10, 20, 40) and s < h["C"]
        if s % h["C"] == 0 or irregular:
            ordered = self.norms.sort().values
            if irregular:
                ordered = ordered[-s:]
            k = ordered.numel()
            self.threshold = h["clip"] * float(ordered[(k // 4) * 2]) * (2.0 if irregular else 1.0)
        return 1.0 if self.threshold is None else min(1.0, self.threshold / (norm + 1e-20))

    @torch.no_grad()
    def step(self) -> None:
        h, s = self.h, self.step_no
        b1, b2 = BETAS
        c = self.clip_factor()
        for p, st in zip(self.params, self.st):
            g = p.grad * c
            st["delta"] *= b1
            st["v"] = st["v"] * b2 + g * g * (1 - b2)
            bc2 = 1 - b2 ** (s + 1)
            if p.numel() == 1:
                step = g / ((st["v"] / bc2).sqrt() + h["eps"])
                st["delta"] += step * (-h["lr"] * h["sls"] * (1 - b1))
                p.add_(st["delta"]).clamp_(-h["smax"], h["smax"])
                continue
            P = h["P"]
            st["sg"][s % P] = (p * g).sum()
            if s % P == P - 1:
                st["rms"] = p.pow(2).mean().sqrt()
                if s > 0:
                    b2p = b2**P
                    st["sv"] = st["sv"] * b2p + (st["sg"] ** 2).mean() * (1 - b2p)
                    bc = 1 - b2p ** ((s + 1) // P)
                    scale_step = -h["lr"] * h["sls"] * bc**0.5 * st["sg"].sum() / (st["sv"].sqrt() + h["eps"])
                    if st["rms"] < h["min_rms"]:
                        scale_step = torch.tensor(0.0)
                    scale_step = torch.minimum(scale_step, (h["max_rms"] - st["rms"]) / st["rms"])
                    st["delta"] += p * scale_step * (1 - b1)
            v = st["v"] / bc2 if bc2 < 0.99 else st["v"]
            st["delta"] += g / (v.sqrt() + h["eps"]) * (-h["lr"] * (1 - b1) * st["rms"].clamp(min=h["min_rms"]))
            p.add_(st["delta"])
        self.step_no += 1


def make_params(seed: int = 0) -> list[torch.nn.Parameter]:
    """Several same-shape tensors (stacking), odd shapes, 1-D biases and scalars of two shapes."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(6, 5), (6, 5), (6, 5), (7,), (7,), (3, 2, 4), (), (), (1,)]
    return [torch.nn.Parameter(torch.randn(s, generator=g) * 0.3 + (0.5 if s in ((), (1,)) else 0.0)) for s in shapes]


def set_grads(params: list[torch.Tensor], step: int, scale: float = 1.0) -> None:
    g = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * scale * (1.0 + 0.3 * math.sin(step))).to(p.dtype)


def run(opt, params, steps: int, start: int = 0) -> None:
    for s in range(start, start + steps):
        set_grads(params, s)
        opt.step()


def clone_params(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def close(a, b, rtol=2e-5, atol=1e-7) -> None:
    for x, y in zip(a, b):
        torch.testing.assert_close(x.detach(), y.detach(), rtol=rtol, atol=atol)


def test_first_step_by_hand():
    w = torch.nn.Parameter(torch.tensor([[1.0, -2.0], [3.0, -4.0]]))
    s = torch.nn.Parameter(torch.tensor(0.5))
    opt = ScaledAdam([w, s], lr=0.1, kernel=False)
    w.grad = torch.tensor([[0.5, -1.0], [2.0, 0.25]])
    s.grad = torch.tensor(-3.0)
    opt.step()
    # step 0: v = (1-beta2) g^2 and the bias correction 1-beta2 give sqrt(v) = |g|, so the step is sign(g)
    # times lr*(1-beta1) times the tensor's RMS sqrt(30/4); scalars use lr*scalar_lr_scale instead.
    rms = math.sqrt(7.5)
    expect_w = torch.tensor([[1.0, -2.0], [3.0, -4.0]]) - 0.1 * 0.1 * rms * torch.tensor([[1.0, -1.0], [1.0, 1.0]])
    torch.testing.assert_close(w.detach(), expect_w, rtol=1e-6, atol=1e-7)
    assert s.item() == pytest.approx(0.5 + 0.1 * 0.1 * 0.1, rel=1e-6)
    st = opt.state[w]
    assert st["step"] == 1 and st["delta"].dtype == torch.float32
    torch.testing.assert_close(st["delta"], expect_w - torch.tensor([[1.0, -2.0], [3.0, -4.0]]))
    torch.testing.assert_close(st["exp_avg_sq"], 0.02 * w.grad**2)


def test_second_step_momentum_by_hand():
    p = torch.nn.Parameter(torch.tensor([2.0, -2.0]))  # rms 2
    opt = ScaledAdam([p], lr=0.1, kernel=False)
    p.grad = torch.tensor([1.0, 1.0])
    opt.step()
    p.grad = torch.tensor([1.0, 1.0])
    opt.step()
    # v after 2 steps = (0.98*0.02 + 0.02) g^2, corrected by 1-0.98^2: sqrt -> |g| again; delta = 0.9*d1 + d1
    d1 = -0.1 * 0.1 * 2.0
    assert p.detach().tolist() == pytest.approx([2.0 + d1 + 1.9 * d1, -2.0 + d1 + 1.9 * d1], rel=1e-6)


@pytest.mark.parametrize("stack_max_numel", [0, 10**9], ids=["per-tensor", "stacked"])
@pytest.mark.parametrize("clipping_scale", [None, 2.0])
def test_matches_per_parameter_reference(stack_max_numel, clipping_scale):
    params = make_params()
    ref_params = clone_params(params)
    opt = ScaledAdam(
        params, lr=0.05, clipping_scale=clipping_scale, clipping_update_period=16, param_max_rms=0.5, kernel=False
    )
    opt.stack_max_numel = stack_max_numel
    ref = Reference(ref_params, lr=0.05, clipping_scale=clipping_scale, clipping_update_period=16, param_max_rms=0.5)
    for s in range(45):  # size updates at 3, 7, ...; clipping estimates at 10 and every 16
        scale = 30.0 if s in (12, 33) else 1.0  # spikes so clipping acts
        set_grads(params, s, scale)
        set_grads(ref_params, s, scale)
        opt.step()
        ref.step()
    close(params, ref_params)
    if clipping_scale is not None:
        assert opt.state[params[0]]["model_norm_threshold"] == pytest.approx(ref.threshold, rel=1e-5)


def test_long_run_matches_reference():
    # past step ~228, where icefall stops bias-correcting exp_avg_sq, and two regular clipping estimates
    params = make_params(seed=1)
    ref_params = clone_params(params)
    opt = ScaledAdam(params, lr=0.02, clipping_scale=2.0, kernel=False)
    ref = Reference(ref_params, lr=0.02, clipping_scale=2.0)
    for s in range(240):
        set_grads(params, s)
        set_grads(ref_params, s)
        opt.step()
        ref.step()
    close(params, ref_params, rtol=1e-4, atol=1e-6)


def test_scalar_is_clamped_after_the_update():
    hi = torch.nn.Parameter(torch.tensor(12.0))  # above the bound, pushed down by 0.01
    top = torch.nn.Parameter(torch.tensor([10.0]))  # at the bound, pushed up by 0.01
    opt = ScaledAdam([hi, top], lr=1.0, scalar_max=10.0, kernel=False)
    hi.grad, top.grad = torch.tensor(1.0), torch.tensor([-1.0])
    opt.step()
    assert hi.item() == 10.0  # clamping before the update would leave 9.99
    assert top.item() == 10.0  # ... and 10.01 here
    assert opt.state[top]["delta"].item() == pytest.approx(0.01)  # momentum itself is not clamped


def test_scale_limits_match_reference():
    # rms 0.8 > param_max_rms: the learned scale must shrink it; rms 1e-6 < param_min_rms: never shrunk further
    big = torch.nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(3)) * 0.8)
    tiny = torch.nn.Parameter(torch.full((5,), 1e-6))
    params, ref_params = [big, tiny], clone_params([big, tiny])
    opt = ScaledAdam(params, lr=0.05, param_max_rms=0.5, kernel=False)
    ref = Reference(ref_params, lr=0.05, param_max_rms=0.5)
    rms0 = big.detach().pow(2).mean().sqrt().item()
    for s in range(24):
        set_grads(params, s)
        set_grads(ref_params, s)
        opt.step()
        ref.step()
    close(params, ref_params)
    assert big.detach().pow(2).mean().sqrt().item() < 0.75 * rms0


def test_clipping_shrinks_the_update():
    base = make_params()
    a_params, b_params, c_params = clone_params(base), clone_params(base), clone_params(base)
    a = ScaledAdam(a_params, lr=0.05, clipping_scale=1.0, clipping_update_period=8, kernel=False)
    run(a, a_params, 9)  # threshold first set at step 8 (a period boundary)
    state = copy.deepcopy(a.state_dict())
    b = ScaledAdam(b_params, kernel=False)
    c = ScaledAdam(c_params, kernel=False)
    for opt, ps in ((b, b_params), (c, c_params)):
        for p, q in zip(ps, a_params):
            p.data.copy_(q.detach())
        opt.load_state_dict(state)
        opt.param_groups[0]["clipping_scale"] = None
    set_grads(a_params, 9, scale=50.0)
    set_grads(c_params, 9, scale=50.0)
    # the factor the clipped optimizer must apply: threshold / RMS-weighted norm
    sumsq = sum(
        float((p.grad**2).sum()) * (0.01 if p.numel() == 1 else float(a.state[p]["param_rms"]) ** 2) for p in a_params
    )
    factor = a.state[a_params[0]]["model_norm_threshold"] / math.sqrt(sumsq)
    assert factor < 0.2
    for p, q in zip(b_params, a_params):
        p.grad = q.grad * factor
    before = [p.detach().clone() for p in a_params]
    a.step(), b.step(), c.step()
    close(a_params, b_params, rtol=1e-5, atol=1e-7)  # the factor reached the whole update
    moved_a = sum(float((p.detach() - q).abs().sum()) for p, q in zip(a_params, before))
    moved_c = sum(float((p.detach() - q).abs().sum()) for p, q in zip(c_params, before))
    assert moved_a < 0.9 * moved_c
    assert a.state[a_params[0]]["num_clipped"] == state["state"][0]["num_clipped"] + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_mid_training(dtype):
    params = [torch.nn.Parameter(p.detach().to(dtype)) for p in make_params()]
    opt = ScaledAdam(params, lr=0.05, clipping_scale=2.0, clipping_update_period=6, kernel=False)
    run(opt, params, 7)  # mid size-period and mid clipping-period
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = ScaledAdam(params2, lr=0.05, clipping_scale=2.0, clipping_update_period=6, kernel=False)
    opt2.load_state_dict(saved)
    assert all(
        v.dtype == torch.float32 for st in opt2.state.values() for v in st.values() if isinstance(v, torch.Tensor)
    )
    run(opt, params, 9, start=7)
    run(opt2, params2, 9, start=7)
    for p, q in zip(params, params2):
        assert torch.equal(p, q)


def test_nonfinite_step_is_skipped_and_logged(caplog):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = ScaledAdam(model.named_parameters(), clipping_scale=2.0, kernel=False)
    params = list(model.parameters())
    run(opt, params, 3)
    before_p = [p.detach().clone() for p in params]
    before_state = copy.deepcopy(opt.state_dict())
    set_grads(params, 3)
    params[2].grad[1, 0] = float("nan")
    params[3].grad[0] = float("inf")
    with caplog.at_level(logging.WARNING, logger="mtl_bench.optim.scaled_adam"):
        opt.step()
    assert "skipped step" in caplog.text and "1.weight" in caplog.text and "1.bias" in caplog.text
    assert opt.skipped_steps == 1
    for p, q in zip(params, before_p):
        assert torch.equal(p.detach(), q)
    after = opt.state_dict()["state"]
    for k, st in before_state["state"].items():
        for key, v in st.items():
            assert torch.equal(torch.as_tensor(after[k][key]), torch.as_tensor(v)), key
    run(opt, params, 2, start=4)  # training goes on
    assert all(torch.isfinite(p).all() for p in params)


def strongly_clipped_step(caplog, level: int, **options) -> list[logging.LogRecord]:
    """Five steps, then one whose gradient is scaled far below 0.1 by clipping; the records logged at `level`+."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = ScaledAdam(model.named_parameters(), clipping_scale=1.0, clipping_update_period=4, kernel=False, **options)
    params = list(model.parameters())
    with caplog.at_level(level, logger="mtl_bench.optim.scaled_adam"):
        run(opt, params, 5)
        set_grads(params, 5)
        params[2].grad *= 1e4
        opt.step()
    return [r for r in caplog.records if r.name == "mtl_bench.optim.scaled_adam"]


def test_strong_clipping_names_the_dominant_parameter_when_asked(caplog):
    records = strongly_clipped_step(caplog, logging.INFO, diagnostics=True)
    warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert any("scaling gradients" in m and "dominated by 1.weight" in m for m in warned)
    assert any("grad-norm quartiles" in r.getMessage() for r in records if r.levelno == logging.INFO)


def test_icefalls_diagnostics_are_debug_lines_by_default(caplog):
    """A default run prints none of icefall's clipping lines; they are there at DEBUG."""
    assert strongly_clipped_step(caplog, logging.INFO) == []
    caplog.clear()
    records = strongly_clipped_step(caplog, logging.DEBUG)
    messages = [r.getMessage() for r in records]
    assert any("scaling gradients" in m and "dominated by 1.weight" in m for m in messages)
    assert any("grad-norm quartiles" in m for m in messages) and {r.levelno for r in records} == {logging.DEBUG}


def test_diagnostics_must_be_a_bool():
    with pytest.raises(ValueError, match="diagnostics: must be true or false, got 'yes'"):
        ScaledAdam(torch.nn.Linear(2, 2).parameters(), diagnostics="yes")


def test_accepts_params_groups_and_names():
    model = torch.nn.Linear(3, 2)
    plain = ScaledAdam(model.parameters(), kernel=False)
    assert plain.param_name(0, 1) == "group0.params[1](2,)"
    named = ScaledAdam(model.named_parameters(), kernel=False)
    assert named.param_name(0, 0) == "weight"
    groups = ScaledAdam(
        [{"named_params": [("w", model.weight)], "lr": 0.1}, {"named_params": [("b", model.bias)]}],
        lr=0.01,
        kernel=False,
    )
    assert [g["lr"] for g in groups.param_groups] == [0.1, 0.01]
    assert groups.param_name(1, 0) == "b"
    model.weight.grad = torch.ones_like(model.weight)  # the bias has no gradient: treated as zero
    groups.step()
    assert groups.state[model.bias]["step"] == 1
    with pytest.raises(ValueError, match="betas"):
        ScaledAdam(model.parameters(), betas=(0.99, 0.9))


def test_chunked_per_tensor_layout_matches_reference():
    # one bucket of CHUNK + 2 same-shape tensors on their own memory: one call covers CHUNK, the rest go one by one
    g = torch.Generator().manual_seed(5)
    params = make_params() + [torch.nn.Parameter(torch.randn(8, 6, generator=g) * 0.2) for _ in range(CHUNK + 2)]
    ref_params = clone_params(params)
    opt = ScaledAdam(params, lr=0.05, clipping_scale=2.0, clipping_update_period=8, kernel=False)
    opt.stack_max_numel = 0
    ref = Reference(ref_params, lr=0.05, clipping_scale=2.0, clipping_update_period=8)
    for s in range(13):
        set_grads(params, s)
        set_grads(ref_params, s)
        opt.step()
        ref.step()
    bucket = next(b for b in opt._plans[0][1] if b.numel == 48)
    assert not bucket.stacked and bucket.chunks() == [(0, CHUNK), (CHUNK, CHUNK + 1), (CHUNK + 1, CHUNK + 2)]
    close(params, ref_params)


def kernel_or_skip() -> None:
    """Build the C++ kernel (a minute the first time on a machine, then cached); skip where it cannot be built."""
    module, error = scaled_adam_kernel.kernel()
    if module is None:
        pytest.skip(f"ScaledAdam's C++ kernel cannot be built here: {error}")


# building the kernel at first use takes about a minute (then torch caches it), so its tests are slow ones
needs_kernel = pytest.mark.slow


@needs_kernel
def test_native_kernel_matches_eager_and_reference():
    # float32 CPU tensors through the C++ kernel: stacks of equal shapes, odd shapes, biases, a missing and a
    # non-contiguous gradient; scalars stay eager beside it. Spikes make clipping act; 45 steps cross size periods.
    g = torch.Generator().manual_seed(5)
    params = make_params() + [torch.nn.Parameter(torch.randn(40, 30, generator=g) * 0.1) for _ in range(CHUNK + 1)]
    eager_params, ref_params = clone_params(params), clone_params(params)
    kw = dict(lr=0.05, clipping_scale=2.0, clipping_update_period=8, param_max_rms=0.5)
    kernel_or_skip()
    native = ScaledAdam(params, kernel=True, **kw)
    eager = ScaledAdam(eager_params, kernel=False, **kw)
    ref = Reference(ref_params, **kw)
    for s in range(45):
        for ps in (params, eager_params, ref_params):
            set_grads(ps, s, 30.0 if s in (12, 33) else 1.0)
            ps[5].grad = ps[5].grad.transpose(0, 2).contiguous().transpose(0, 2)  # same values, not contiguous
            if s == 7:
                ps[9].grad = torch.zeros_like(ps[9]) if ps is ref_params else None
        native.step(), eager.step(), ref.step()
    assert native.uses_kernel and not eager.uses_kernel
    assert native.implementation == KERNEL and eager.implementation == EAGER
    assert all(b.native != b.scalar for b in native._plans[0][1])
    close(params, eager_params, rtol=1e-5, atol=1e-7)
    close(params, ref_params)
    assert native.state[params[0]]["model_norm_threshold"] == pytest.approx(ref.threshold, rel=1e-5)


@needs_kernel
def test_native_kernel_skips_a_nonfinite_step():
    kernel_or_skip()
    params = make_params()
    opt = ScaledAdam(params, lr=0.05, clipping_scale=2.0, kernel=True)
    run(opt, params, 3)
    before = [p.detach().clone() for p in params]
    set_grads(params, 3)
    params[1].grad[2, 3] = float("nan")
    opt.step()
    assert opt.uses_kernel and opt.skipped_steps == 1
    assert all(torch.equal(p.detach(), q) for p, q in zip(params, before))
    run(opt, params, 2, start=4)
    assert all(torch.isfinite(p).all() for p in params)


@needs_kernel
def test_native_plan_follows_a_parameter_that_changes_layout():
    kernel_or_skip()
    params = make_params()
    opt = ScaledAdam(params, kernel="auto")
    opt._native = True  # as if the model were large enough
    run(opt, params, 2)
    buckets, native = opt._plan(0, opt.param_groups[0])
    assert native is not None and any(p is params[0] for p in native.params)
    params[0].data = params[0].data.t().contiguous().t()  # same values, no longer contiguous: the kernel's
    buckets, native = opt._plan(0, opt.param_groups[0])  # raw-memory loop must not take it any more
    assert not any(p is params[0] for p in native.params)
    assert not next(b for b in buckets if any(p is params[0] for p in b.params)).native


INVALID = [
    ("lr", dict(lr=-1.0)),
    ("clipping_scale", dict(clipping_scale=0.0)),
    ("betas", dict(betas=(0.99, 0.9))),
    ("betas", dict(betas=(0.9, 1.0))),
    ("scalar_lr_scale", dict(scalar_lr_scale=-0.1)),
    ("eps", dict(eps=-1e-8)),
    ("param_min_rms", dict(param_min_rms=0.0)),
    ("param_max_rms", dict(param_max_rms=1e-6)),
    ("scalar_max", dict(scalar_max=0.0)),
    ("size_update_period", dict(size_update_period=0)),
    ("clipping_update_period", dict(clipping_update_period=2.5)),
    ("kernel", dict(kernel="yes")),
]


@pytest.mark.parametrize("name,kwargs", INVALID, ids=[f"{n}-{i}" for i, (n, _) in enumerate(INVALID)])
def test_bad_values_raise_naming_the_argument(name, kwargs):
    with pytest.raises(ValueError) as err:
        ScaledAdam([torch.nn.Parameter(torch.ones(2, 2))], **kwargs)
    assert str(err.value).startswith(f"{name}: ")


def test_signature_is_the_declaration_of_options():
    # config groups build ScaledAdam by `_target_`: every option typed, defaulted and documented on one line
    sig = inspect.signature(ScaledAdam.__init__)
    names = [n for n in sig.parameters if n != "self"]
    assert names[0] == "params"
    doc = inspect.getdoc(ScaledAdam.__init__)
    for name in names:
        param = sig.parameters[name]
        assert param.annotation is not inspect.Parameter.empty, name
        assert name == "params" or param.default is not inspect.Parameter.empty, name
        assert sum(line.strip().startswith(f"{name}: ") for line in doc.splitlines()) == 1, name


@needs_kernel
def test_kernel_blocks_and_threads_match_eager():
    # tensors longer than the kernel's block (2^20 elements) are summed block by block, across 2 threads; the
    # result must not depend on that split
    kernel_or_skip()
    g = torch.Generator().manual_seed(7)
    params = make_params() + [torch.nn.Parameter(torch.randn(1030, 1030, generator=g) * 0.1) for _ in range(2)]
    eager_params = clone_params(params)
    kernel = ScaledAdam(params, lr=0.05, clipping_scale=2.0, clipping_update_period=8, kernel=True)
    eager = ScaledAdam(eager_params, lr=0.05, clipping_scale=2.0, clipping_update_period=8, kernel=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for s in range(12):
            set_grads(params, s)
            set_grads(eager_params, s)
            kernel.step()
            eager.step()
    finally:
        torch.set_num_threads(threads)
    assert kernel.uses_kernel and not eager.uses_kernel
    close(params, eager_params, rtol=1e-5, atol=1e-6)


def big_params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(AUTO_KERNEL_MIN_NUMEL)), torch.nn.Parameter(torch.zeros(()))]


def test_unbuildable_kernel_auto_says_why_and_true_is_a_config_error(monkeypatch, caplog):
    monkeypatch.setattr(scaled_adam_kernel, "kernel", lambda: (None, "RuntimeError: Ninja is required"))
    with caplog.at_level(logging.INFO, logger="mtl_bench"):
        auto = ScaledAdam(big_params(), kernel="auto")
    assert auto.implementation == EAGER and not auto.uses_kernel
    assert "cannot be built here (RuntimeError: Ninja is required)" in auto.implementation_reason
    lines = [r.getMessage() for r in caplog.records if r.name == "mtl_bench"]
    assert lines == [f"ScaledAdam: eager update ({auto.implementation_reason})"]
    with pytest.raises(ValueError) as err:  # the builder reports it as `optim.kernel: ...`
        ScaledAdam(big_params(), kernel=True)
    message = str(err.value)
    assert message.startswith("kernel: true, but ScaledAdam's C++ kernel cannot be built here") and "Ninja" in message
    assert "\n" not in message


def test_kernel_true_refuses_what_the_kernel_cannot_take():
    with pytest.raises(ValueError, match=r"^kernel: true needs float32 contiguous CPU parameters.*bfloat16"):
        ScaledAdam([torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.bfloat16))], kernel=True)


def test_kernel_auto_decides_by_size(monkeypatch):
    small = ScaledAdam([torch.nn.Parameter(torch.zeros(10, 10))], kernel="auto")
    small.param_groups[0]["params"][0].grad = torch.ones(10, 10)
    small.step()
    assert not small.uses_kernel and small.implementation == EAGER
    assert small.implementation_reason.startswith("kernel=auto: 100 elements in float32 CPU tensors, under")
    off = ScaledAdam(big_params(), kernel=False)
    assert off.implementation == EAGER and off.implementation_reason == "kernel=false"
    built = []
    monkeypatch.setattr(scaled_adam_kernel, "kernel", lambda: (built.append(1) or object(), ""))
    big = ScaledAdam(big_params(), kernel="auto")  # from AUTO_KERNEL_MIN_NUMEL elements on: the kernel
    assert big.uses_kernel and big.implementation == KERNEL and big.implementation_reason == "kernel=auto" and built


def test_kernel_true_refuses_a_parameter_that_changes_layout_later(monkeypatch):
    monkeypatch.setattr(scaled_adam_kernel, "kernel", lambda: (object(), ""))  # never called: the plan refuses first
    params = make_params()
    opt = ScaledAdam(params, kernel=True)
    assert opt.implementation == KERNEL and opt.implementation_reason == "kernel=true"
    params[0].data = params[0].data.t().contiguous().t()  # same values, no longer contiguous
    set_grads(params, 0)
    with pytest.raises(
        ConfigError,
        match=r"^kernel: true needs float32 .*group0.params\[0\]\(6, 5\) is cpu torch.float32, not contiguous;",
    ):
        opt.step()
