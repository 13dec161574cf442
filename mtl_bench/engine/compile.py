"""`trainer.compile`: torch.compile the model's forward, keeping what the balancers differentiate reachable.

Three things the balancers do constrain what is compiled and how:

- They take gradients at the shared representation (`out.shared`) and at the last shared layer (GradNorm
  hooks an `nn.Linear` there and differentiates its output). Compiled as one graph (`torch.compile(model)`),
  trunk and heads become one autograd node whose side outputs the losses do not depend on:
  `autograd.grad(loss, out.shared)` then fails ("appears to not have been used in the graph"). So the
  compiled region is the trunk up to its last shared layer; that layer, the rest of the trunk and the heads
  run eagerly.
- A balancer may take all T task gradients through the trunk in one batched vector-Jacobian product
  (`autograd.grad(..., is_grads_batched=True)`, i.e. under vmap; the zoo's gradient methods take T backwards
  instead, tests/helpers/param_jacobian.py still offers the product). Inductor's
  compiled kernels cannot read vmap's batched tensors ("Cannot access storage of BatchedTensorImpl"). So the
  region is compiled through AOTAutograd with inductor for the forward and for the backward, and a backward
  called with batched gradients runs the same backward graph eagerly (ATen ops, which vmap batches).
- Their values must not change: the compiled region computes the eager model's function, to float32
  rounding (the compiler fuses and reorders arithmetic).

CUDA graphs ("triton.cudagraphs", part of reduce-overhead and max-autotune) are not applied: the balancers'
own backwards and batched products run between a forward and the next, which CUDA graphs' static output
buffers do not allow for; the modes' other options are.

Compilation happens at the first call. When it fails (no C++ compiler, an unsupported Python, an op the
compiler rejects), at wrap time, at the first forward or at the first backward, the run stops with a
`CompileError`: one line naming the reason (the CLI prints it as any ConfigError). It never goes on eagerly:
a user who asked for trainer.compile gets it or learns why not. `implementation_of(module)` says what runs
("eager" or "torch.compile mode=...: ..."), for the run's records; `maybe_compile` logs it once.

Private torch APIs, used because torch has no public one for what they do: `aot_autograd` and
`make_boxed_func` (a backend that compiles the forward and the backward graphs separately, so that a
backward called with batched gradients can run its graph eagerly), `torch._inductor.compile` (inductor on one
such graph), `torch._inductor.list_mode_options` (what a `mode` means, as torch.compile reads it) and
`torch._C._dispatch_keys` (whether a gradient is one of vmap's batched tensors).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from mtl_bench.errors import ConfigError
from mtl_bench.models.base import ModelOutput, MultiTaskModel
from mtl_bench.settings import CompileSetting, compile_mode

log = logging.getLogger("mtl_bench")


class CompileError(ConfigError):
    """trainer.compile was asked for and cannot be had here; the message is one line saying why."""


def compile_failed(mode: str, err: BaseException, when: str) -> CompileError:
    return CompileError(
        f"trainer.compile={mode}: torch.compile failed {when} ({describe(err)}); set trainer.compile=false "
        "to train eagerly"
    )


def maybe_compile(model: nn.Module, setting: CompileSetting) -> nn.Module:
    """`model` itself when `setting` is false/None; else a module whose forward runs the model with the
    trunk, up to its last shared layer, compiled (see the module docstring). Build the balancer before
    calling this (it may hook the last shared layer). An nn.Module that is not a MultiTaskModel is compiled
    whole. CompileError where compilation cannot be had; one log line says what runs."""
    mode = compile_mode(setting)
    if mode is None:
        return model
    compiled: nn.Module = (
        CompiledForward(model, mode) if isinstance(model, MultiTaskModel) else CompiledModule(model, mode)
    )
    log.info("trainer.compile: %s", implementation_of(compiled))
    return compiled


def implementation_of(module: nn.Module) -> str:
    """What runs the forward: "eager", or the compiled region and mode of a module from `maybe_compile`."""
    return str(getattr(module, "implementation", "eager"))


# ----------------------------------------------------------------------------- the compiler


def is_batched(value: Any) -> bool:
    """Whether `value` is a vmap batched tensor (autograd.grad(..., is_grads_batched=True) or torch.func.vmap)."""
    # is_batchedtensor() misses the batched gradients autograd hands a backward graph under vmap; their dispatch
    # keys say it (FuncTorchBatched)
    return isinstance(value, Tensor) and "Batched" in str(torch._C._dispatch_keys(value))


def compile_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any], backward: bool
) -> Callable[..., Any]:
    """One AOTAutograd graph (the forward, or the backward when `backward`) compiled by inductor."""
    return torch._inductor.compile(gm, list(example_inputs), options=options)


def inductor_backend(mode: str) -> Callable[..., Any]:
    """A torch.compile backend: inductor for the forward and the backward, and the backward graph run eagerly
    when its incoming gradients are batched (the same graph: ATen ops, which vmap batches). A graph inductor
    cannot compile raises CompileError."""
    import torch._inductor
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    options = {k: v for k, v in torch._inductor.list_mode_options(mode).items() if k != "triton.cudagraphs"}

    def forward_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        return make_boxed_func(compile_graph(gm, example_inputs, options, backward=False))

    def backward_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        try:
            compiled = compile_graph(gm, example_inputs, options, backward=True)
        except Exception as err:  # may be called lazily, at the first backward: say so in the run's own words
            raise compile_failed(mode, err, "on the backward graph") from err

        def run(*args: Any) -> Any:
            return gm(*args) if any(is_batched(a) for a in args) else compiled(*args)

        return make_boxed_func(run)

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler)


def _compile(module: nn.Module, mode: str) -> Callable[..., Any]:
    """torch.compile(module) with the inductor backend above; CompileError where torch.compile refuses at once."""
    try:
        return torch.compile(module, backend=inductor_backend(mode))
    except Exception as err:  # e.g. dynamo on an unsupported Python
        raise compile_failed(mode, err, "at wrap time") from err


def _call(mode: str, compiled: Callable[..., Any], eager: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`compiled(*args)`; a failure is a CompileError, unless the eager module fails the same inputs too: the
    input is then at fault and the eager error is the one to see. (Re)compilation runs inside the call, before
    the graph touches anything."""
    try:
        return compiled(*args, **kwargs)
    except Exception as err:
        cause: BaseException | None = err
        while cause is not None and not isinstance(cause, CompileError):  # the backward's, wrapped by dynamo
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        eager(*args, **kwargs)  # raises the input's own error, if it is one
        raise compile_failed(mode, err, "on the forward") from err


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
    module). Checkpoint the model itself: its state_dict keys are unchanged. `implementation` says what is
    compiled. A trunk that cannot be cut before its hooked last shared layer is a CompileError.
    """

    # kept in __dict__, outside the module registry: they share the model's layers
    _region: nn.Module
    _rest: nn.Module
    _fn: Callable[..., Any]

    compiled = True  # there is no eager fallback: a failure stops the run

    def __init__(self, model: MultiTaskModel, mode: str) -> None:
        super().__init__()
        self.model = model  # the only registered child: the pieces below share its layers
        self.mode = mode
        region, rest, why = split_trunk(model)
        if region is None:
            raise CompileError(f"trainer.compile={mode}: cannot compile this model: {why}; set trainer.compile=false")
        self.__dict__.update(_region=region, _rest=rest, _fn=_compile(region, mode))
        where = "the trunk before its last shared layer" if not isinstance(rest, nn.Identity) else "the whole trunk"
        self.implementation = f"torch.compile mode={mode} (inductor): {where}; the heads eager"

    def _trunk(self, x: Tensor) -> Tensor:
        return self._rest(_call(self.mode, self._fn, self._region, x))

    def forward(self, x: Tensor, tasks: Optional[Sequence[str]] = None) -> ModelOutput:
        """MultiTaskModel.forward: the shared representation, and the predictions of every head or of `tasks`."""
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
    """Any module compiled whole with the same backend (modules outside the MultiTaskModel contract)."""

    _fn: Callable[..., Any]
    compiled = True  # there is no eager fallback: a failure stops the run

    def __init__(self, module: nn.Module, mode: str) -> None:
        super().__init__()
        self.module = module
        self.mode = mode
        self.__dict__["_fn"] = _compile(module, mode)
        self.implementation = f"torch.compile mode={mode} (inductor): the whole {type(module).__name__}"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self.mode, self._fn, self.module, *args, **kwargs)
