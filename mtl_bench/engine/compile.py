"""`trainer.compile`: torch.compile the model's forward, keeping what the balancers differentiate reachable.

Three things the balancers do constrain what is compiled and how:

- They take gradients at the shared representation (`out.shared`) and at the last shared layer (GradNorm
  hooks an `nn.Linear` there and differentiates its output). Compiled as one graph (`torch.compile(model)`),
  trunk and heads become one autograd node whose side outputs the losses do not depend on:
  `autograd.grad(loss, out.shared)` then fails ("appears to not have been used in the graph"). So the
  compiled region is the trunk up to its last shared layer; that layer, the rest of the trunk and the heads
  run eagerly.
- The Jacobian methods (MGDA, PCGrad, UPGrad, ...) take all T task gradients through the trunk in one
  batched vector-Jacobian product (`autograd.grad(..., is_grads_batched=True)`, i.e. under vmap). Inductor's
  compiled kernels cannot read vmap's batched tensors ("Cannot access storage of BatchedTensorImpl"). So the
  region is compiled through AOTAutograd with inductor for the forward and for the backward, and a backward
  called with batched gradients runs the same backward graph eagerly (ATen ops, which vmap batches).
- Their values must not change: the compiled region computes the eager model's function, to float32
  rounding (the compiler fuses and reorders arithmetic).

CUDA graphs ("triton.cudagraphs", part of reduce-overhead and max-autotune) are not applied: the balancers'
own backwards and batched products run between a forward and the next, which CUDA graphs' static output
buffers do not allow for; the modes' other options are.

Compilation happens at the first call. When it fails (no C++ compiler, an unsupported Python, an op the
compiler rejects), the forward runs eagerly from then on and one warning line says why.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.models.base import ModelOutput, MultiTaskModel
from mtl_bench.settings import CompileSetting, compile_mode

log = logging.getLogger("mtl_bench")


def maybe_compile(model: nn.Module, setting: CompileSetting) -> nn.Module:
    """`model` itself when `setting` is false/None; else a module whose forward runs the model with the
    trunk, up to its last shared layer, compiled (see the module docstring). Build the balancer before
    calling this (it may hook the last shared layer). An nn.Module that is not a MultiTaskModel is compiled
    whole, with the same fallback to eager."""
    mode = compile_mode(setting)
    if mode is None:
        return model
    if isinstance(model, MultiTaskModel):
        return CompiledForward(model, mode)
    return CompiledModule(model, mode)


# ----------------------------------------------------------------------------- the compiler


def is_batched(value: Any) -> bool:
    """Whether `value` is a vmap batched tensor (autograd.grad(..., is_grads_batched=True) or torch.func.vmap)."""
    return isinstance(value, Tensor) and "Batched" in str(torch._C._dispatch_keys(value))


def compile_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any], backward: bool
) -> Callable[..., Any]:
    """One AOTAutograd graph (the forward, or the backward when `backward`) compiled by inductor."""
    return torch._inductor.compile(gm, list(example_inputs), options=options)


def inductor_backend(mode: str, on_failure: Callable[[BaseException, str], None]) -> Callable[..., Any]:
    """A torch.compile backend: inductor for the forward and the backward, and the backward graph run eagerly
    when its incoming gradients are batched (or when inductor cannot compile it, after `on_failure`)."""
    import torch._inductor
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    options = {k: v for k, v in torch._inductor.list_mode_options(mode).items() if k != "triton.cudagraphs"}

    def forward_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        return make_boxed_func(compile_graph(gm, example_inputs, options, backward=False))

    def backward_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        try:
            compiled = compile_graph(gm, example_inputs, options, backward=True)
        except Exception as err:  # the forward is compiled already; the eager backward graph is the same math
            on_failure(err, "the backward runs eagerly")
            return make_boxed_func(gm)

        def run(*args: Any) -> Any:
            return gm(*args) if any(is_batched(a) for a in args) else compiled(*args)

        return make_boxed_func(run)

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler)


class _Compiled:
    """torch.compile(module) with the inductor backend above; `fn` is None once compilation failed (warned once)."""

    def __init__(self, module: nn.Module, mode: str) -> None:
        self.warned = False
        self.fn: Optional[Callable[..., Any]] = None
        try:
            self.fn = torch.compile(module, backend=inductor_backend(mode, self.warn))
        except Exception as err:  # torch.compile refuses at once where dynamo is unsupported
            self.fail(err)

    def warn(self, err: BaseException, consequence: str = "the model runs eagerly") -> None:
        if not self.warned:
            self.warned = True
            log.warning("trainer.compile: torch.compile failed (%s); %s", describe(err), consequence)

    def fail(self, err: BaseException) -> None:
        self.warn(err)
        self.fn = None


def describe(err: BaseException) -> str:
    """`Outer: Root: first line of the root cause` (dynamo wraps the backend's error)."""
    root = err
    for _ in range(10):
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if not isinstance(inner, BaseException) or inner is root:
            break
        root = inner
    first = (str(root).strip().splitlines() or [""])[0][:300]
    names = type(err).__name__ + (f": {type(root).__name__}" if root is not err else "")
    return f"{names}: {first}" if first else names


# ----------------------------------------------------------------------------- the modules


class CompiledForward(nn.Module):
    """A MultiTaskModel's forward with the trunk's part before the last shared layer compiled.

    Holds the model as its only child (the same parameters; `train()`/`eval()` reach it; DDP may wrap this
    module). Checkpoint the model itself: its state_dict keys are unchanged. `compiled` says whether the
    compiled region is in use (False once compilation failed).
    """

    # kept in __dict__, outside the module registry: they share the model's layers
    _region: Optional[nn.Module]
    _rest: nn.Module
    _compiled: Optional[_Compiled]

    def __init__(self, model: MultiTaskModel, mode: str) -> None:
        super().__init__()
        self.model = model  # the only registered child: the pieces below share its layers
        self.mode = mode
        region, rest, why = split_trunk(model)
        self.__dict__.update(_region=region, _rest=rest, _compiled=None)
        if region is None:
            log.warning("trainer.compile: %s; the model runs eagerly", why)
        else:
            self.__dict__["_compiled"] = _Compiled(region, mode)

    @property
    def compiled(self) -> bool:
        return self._compiled is not None and self._compiled.fn is not None

    def _trunk(self, x: Tensor) -> Tensor:
        if self._compiled is not None and self._compiled.fn is not None:
            try:
                return self._rest(self._compiled.fn(x))
            except Exception as err:
                # Compilation runs inside the call, before the graph touches anything. If the eager region fails
                # as well, the input is at fault and that error is the one to see.
                assert self._region is not None
                hidden = self._region(x)
                self._compiled.fail(err)
                return self._rest(hidden)
        assert self._region is not None
        return self._rest(self._region(x))

    def forward(self, x: Tensor, tasks: Optional[Sequence[str]] = None) -> ModelOutput:
        """MultiTaskModel.forward: the shared representation, and the predictions of every head or of `tasks`."""
        if self._region is None:
            return self.model(x, tasks=tasks)
        shared = self._trunk(x)
        heads = self.model.heads
        names = heads.keys() if tasks is None else tasks
        return ModelOutput(shared=shared, preds={name: heads[name](shared) for name in names})


def split_trunk(model: MultiTaskModel) -> tuple[Optional[nn.Module], nn.Module, str]:
    """(the region to compile, what runs after it eagerly, why there is no region).

    A Sequential trunk holding the last shared layer is cut before it. Another trunk is compiled whole, unless
    the last shared layer inside it is hooked (its output must then be an eager tensor).
    """
    if type(model).forward is not MultiTaskModel.forward:
        return (
            None,
            model,
            (
                f"{type(model).__name__} defines its own forward (only MultiTaskModel's trunk-then-"
                "heads forward is split before the last shared layer)"
            ),
        )
    trunk, last = model.trunk, model.last_shared_layer
    if isinstance(trunk, nn.Sequential):
        index = next((i for i, layer in enumerate(trunk) if layer is last), None)
        if index == 0:
            return None, model, "the trunk's first layer is its last shared layer: nothing comes before it"
        if index is not None:
            return nn.Sequential(*trunk[:index]), nn.Sequential(*trunk[index:]), ""
    inside = any(m is last for m in trunk.modules())
    if inside and (last._forward_hooks or last._forward_pre_hooks):
        return (
            None,
            model,
            (
                f"the hooked last shared layer ({type(last).__name__}) lies inside a "
                f"{type(trunk).__name__} trunk that cannot be cut before it"
            ),
        )
    return trunk, nn.Identity(), ""


class CompiledModule(nn.Module):
    """Any module compiled whole with the same backend and fallback (modules outside the MultiTaskModel contract)."""

    _compiled: _Compiled

    def __init__(self, module: nn.Module, mode: str) -> None:
        super().__init__()
        self.module = module
        self.__dict__["_compiled"] = _Compiled(module, mode)

    @property
    def compiled(self) -> bool:
        return self._compiled.fn is not None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._compiled.fn is not None:
            try:
                return self._compiled.fn(*args, **kwargs)
            except Exception as err:
                out = self.module(*args, **kwargs)
                self._compiled.fail(err)
                return out
        return self.module(*args, **kwargs)
