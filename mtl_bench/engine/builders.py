"""From config nodes to objects: every part is its `_target_` class, built by `hydra.utils.instantiate`.

The class's constructor signature is the one declaration of its options. Before anything is built,
`check_part` compares a node's keys and values with that signature (unknown key, wrong type, missing
argument: one line naming the key). The engine then supplies what it knows at build time (task names, the
model, parameter groups, ...) by name, to whichever of those arguments the signature has. Any error the
constructor raises becomes one ConfigError line naming the config key: a ValueError whose message starts
with an argument's name ("alpha: must be >= 0, got -1") is reported as `balancer.alpha: must be >= 0, got -1`.
"""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import re
import types
import typing
from typing import Any, Callable, Iterable, Mapping, Optional

import torch
from hydra._internal.utils import _locate  # what hydra.utils.get_object uses, without its ERROR log line
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mtl_bench.balancers.weighting import WEIGHTING_ARGUMENTS, Weighting
from mtl_bench.config import ENGINE_KEYS
from mtl_bench.errors import ConfigError
from mtl_bench.gradient_engine.balancer import BUILD_ARGUMENTS
from mtl_bench.hydra_errors import closest

HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
# Each part's config key and the arguments the engine passes it by name at build time (engine/compose.py): these
# are never config keys.
SUPPLIED: dict[str, tuple[str, ...]] = {
    "tasks": (),
    "model": ("input_shape", "heads"),
    "model.arch": ("backbone",),
    "model.front": ("model", "input_shape", "heads"),
    "balancer": tuple(BUILD_ARGUMENTS),
    "optim": ("params",),
    "precision": ("device",),
    "optim.schedule": ("optimizer", "total_steps", "steps_per_epoch"),
    "select": ("higher_is_better", "reference", "eval_steps"),
}
# Each logger under `logger.<name>` is given the run's facts (loggers.RunInfo).
LOGGER_SUPPLIED = ("run",)
# A node inside a part's (`balancer.weighting`) is built by that part, which supplies these to its kind of class.
NESTED_SUPPLIED: dict[type, tuple[str, ...]] = {Weighting: tuple(WEIGHTING_ARGUMENTS)}


def node_dict(node: Any) -> dict[str, Any]:
    """A config node as a plain dict (resolved)."""
    if isinstance(node, DictConfig):
        # A DictConfig's container is a dict with string keys (OmegaConf's return type covers every node).
        return typing.cast("dict[str, Any]", OmegaConf.to_container(node, resolve=True))
    return dict(node)


def target_of(key: str, node: Mapping[str, Any]) -> Callable[..., Any]:
    path = node.get("_target_")
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{key}._target_: missing; set the class to build, e.g. {key}._target_=my_pkg.module.Class")
    try:
        return _locate(path)
    except Exception as err:  # ImportError, AttributeError, ...: Hydra wraps them
        missing = _missing_attribute(path)
        if missing:
            raise ConfigError(f"{key}._target_: {missing}") from None
        reason = str(err.__cause__ or err).strip().splitlines()[0]
        raise ConfigError(f"{key}._target_: cannot import {path!r} ({reason})") from None


def _missing_attribute(path: str) -> Optional[str]:
    """ "module 'my_lab.weightings' has no class 'Foo' (did you mean ...)" when the module imports and lacks the
    name (Hydra's own message then says the module "is not a package"); None otherwise."""
    module_path, _, name = path.rpartition(".")
    if not module_path:
        return None
    try:
        module = importlib.import_module(module_path)
    except Exception:  # the module itself does not import: Hydra's reason says why
        return None
    if hasattr(module, name):
        return None
    defined = [n for n, v in vars(module).items() if callable(v) and getattr(v, "__module__", None) == module.__name__]
    return f"module {module_path!r} has no class {name!r}{closest(name, defined, prefix=module_path + '.')}"


def parameters(target: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The constructor's parameters with evaluated annotations where they can be evaluated."""
    try:
        signature = inspect.signature(target, eval_str=True)
    except Exception:  # an annotation naming something not importable at run time: check names only
        signature = inspect.signature(target)
    return dict(signature.parameters)


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not typing.get_args(annotation) else None
    return text or str(annotation).replace("typing.", "").replace("NoneType", "null")


PLAIN = (bool, int, float, str, list, tuple, dict, type(None))
CONTAINERS = (
    list,
    tuple,
    dict,
    collections.abc.Sequence,
    collections.abc.Iterable,
    collections.abc.MutableSequence,
    collections.abc.Mapping,
    collections.abc.MutableMapping,
    typing.Literal,
)


def _checkable(annotation: Any) -> bool:
    """Whether a config value can be checked against this annotation (plain types, containers, Literal)."""
    return annotation in PLAIN or typing.get_origin(annotation) in CONTAINERS


def matches(value: Any, annotation: Any) -> bool:
    """Whether a config value (plain Python: numbers, strings, lists, dicts, None) fits the annotation.

    Annotations a config value cannot be checked against (tensors, paths, unknown classes) accept anything,
    unless they are one member of a union that has checkable members: `lr: float | Tensor` wants a number.
    """
    if annotation in (inspect.Parameter.empty, Any) or isinstance(annotation, str):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        checkable = [
            arg for arg in args if _checkable(arg) or typing.get_origin(arg) in (typing.Union, types.UnionType)
        ]
        return any(matches(value, arg) for arg in checkable) if checkable else True
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches(v, args[0]) for v in value)
        return not args or (len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args)))
    if origin in (list, collections.abc.Sequence, collections.abc.Iterable, collections.abc.MutableSequence):
        if not isinstance(value, (list, tuple)):
            return False
        return not args or all(matches(v, args[0]) for v in value)
    if annotation in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping) or annotation is dict:
        return isinstance(value, dict)
    return True


def _wants_mapping(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_wants_mapping(arg) for arg in typing.get_args(annotation))
    mappings = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
    return annotation is dict or typing.get_origin(annotation) in mappings


def _as_mapping(key: str, value: Any, annotation: Any) -> str:
    """For a list given where a mapping (by task name) is wanted: the same values written as a mapping, with the
    default task set's names (t0, t1, ...) standing in for the user's."""
    if not isinstance(value, (list, tuple)) or not _wants_mapping(annotation):
        return ""
    shown = ", ".join(f"t{i}: {v}" for i, v in enumerate(value))
    return f"; give it by task name: '{key}={{{shown}}}' (t0, t1, ...: tasks=toy's names; use your task set's)"


def check_part(
    key: str, node: Mapping[str, Any], supplied: Iterable[str] = (), ignore: Iterable[str] = (), nested: bool = False
) -> Callable[..., Any]:
    """Check a node against its `_target_`'s signature; returns the target. `supplied`: arguments the engine
    gives at build time (not config keys); `ignore`: keys the engine reads itself (optim.schedule, ...); `nested`:
    a node inside a part's (a weighting), whose `_partial_: true` leaves arguments to the part that builds it."""
    target = target_of(key, node)
    if not callable(target):
        raise ConfigError(f"{key}._target_: {node['_target_']!r} is not a class or function")
    params = parameters(target)
    known = nested_supplied(target) if nested else None
    if known is not None:  # a node whose builder is known: what it leaves out must be what that builder supplies
        supplied, nested = [*supplied, *known], False
        asked = [n for n in known if n in params and params[n].default is inspect.Parameter.empty]
        if asked and not node.get("_partial_"):
            raise ConfigError(
                f"{key}._partial_: {node['_target_']} takes {asked[0]} from the engine; add {key}._partial_=true"
            )
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    supplied, ignore = set(supplied), set(ignore)
    options = [
        name
        for name, p in params.items()
        if name not in supplied and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    for name, value in node.items():
        if name in HYDRA_KEYS or name in ignore:
            continue
        if name in supplied:
            raise ConfigError(f"{key}.{name}: given by the engine at build time, not a config option")
        if name not in params:
            if takes_any:
                continue
            hint = f"; choose the option with {key.replace('.', '/')}=<option>" if name == "name" else ""
            raise ConfigError(
                f"{key}.{name}: not an option of {node['_target_']}{closest(name, options, prefix=key + '.')}; "
                f"options: {', '.join(options) or '(none)'}{hint}"
            )
        annotation = params[name].annotation
        if isinstance(value, Mapping) and "_target_" in value:  # a part of the part (a weighting): its own keys
            check_part(f"{key}.{name}", value, nested=True)
            continue
        if not matches(value, annotation):
            raise ConfigError(
                f"{key}.{name}: expected {_type_name(annotation)}, got {value!r}"
                + _as_mapping(f"{key}.{name}", value, annotation)
            )
    for name, p in params.items():
        required = p.default is inspect.Parameter.empty and p.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )
        if required and name not in node and name not in supplied and not (nested and node.get("_partial_")):
            raise ConfigError(f"{key}.{name}: {node['_target_']} needs it; add +{key}.{name}=<value>")
    return target


def nested_supplied(target: Callable[..., Any]) -> Optional[tuple[str, ...]]:
    """The arguments a part supplies to a node of this class inside its own (a weighting's task_names); None when
    the class is of no kind the engine knows (then a `_partial_` node may leave any argument to its part)."""
    for kind, names in NESTED_SUPPLIED.items():
        if isinstance(target, type) and issubclass(target, kind):
            return names
    return None


def option_names(key: str, node: Mapping[str, Any]) -> list[str]:
    """The keys a part's node may hold: those its YAML sets, then its class's other options (not the arguments the
    engine supplies at build time)."""
    params = parameters(target_of(key, node))
    supplied = set(SUPPLIED.get(key, ()))
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    taken = [name for name, p in params.items() if name not in supplied and p.kind not in variadic]
    return list(dict.fromkeys([*(k for k in node if k not in HYDRA_KEYS), *taken]))


def build(key: str, node: Any, kind: type | None = None, ignore: Iterable[str] | None = None, **supplied: Any) -> Any:
    """Check `node`, then instantiate its `_target_` with the config's options and the engine's `supplied`
    arguments that the signature takes; any error is one ConfigError line naming `key`. The keys the engine
    reads itself (`config.ENGINE_KEYS[key]`, e.g. `tasks.front_reference`) are left out unless `ignore` says."""
    if ignore is None:
        ignore = ENGINE_KEYS.get(key, ())
    config = {k: v for k, v in node_dict(node).items() if k not in set(ignore)}
    target = check_part(key, config, supplied, ignore)
    params = parameters(target)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    given = {name: value for name, value in supplied.items() if name in params or takes_any}
    try:
        factory = instantiate(config, _partial_=True, _convert_="all")
        part = factory(**given)
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(describe_build_error(key, err, params, config)) from None
    if kind is not None and not isinstance(part, kind):
        raise ConfigError(
            f"{key}._target_: {config['_target_']} built a {type(part).__name__}, not a "
            f"{kind.__module__}.{kind.__name__}"
        )
    return part


def describe_build_error(
    key: str, err: BaseException, params: Mapping[str, Any], config: Optional[Mapping[str, Any]] = None
) -> str:
    """`balancer.alpha: must be >= 0, got -1` when the message starts with an argument's name; a message that
    names no argument (torch's "Invalid learning rate: -1") is given the key whose value it quotes, when
    exactly one key of the node has that value."""
    while type(err).__name__ == "InstantiationException" and err.__cause__ is not None:
        err = err.__cause__
    message = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if isinstance(err, KeyError):
        message = message.strip("'\"")
    head = message.split(":", 1)[0].split(".", 1)[0]
    if head in params and ":" in message:
        return f"{key}.{message}"
    words = set(re.findall(r"[-+\w.]+", message))
    quoted = [name for name, value in (config or {}).items() if name not in HYDRA_KEYS and _shown(value) in words]
    if len(quoted) == 1:
        return f"{key}.{quoted[0]}: {message}"
    return f"{key}: {message}"


def _shown(value: Any) -> str:
    """How a message would print a config value (ints as ints, -1.0 as -1.0)."""
    return str(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else "\0"


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name!r} but CUDA is not available here (allowed: auto, cpu)")
    return device
