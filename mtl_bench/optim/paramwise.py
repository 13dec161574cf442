"""Parameter groups from an mmcv-style `paramwise_cfg` (mmcv DefaultOptimizerConstructor.add_params)."""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

from mtl_bench.errors import ConfigError

PARAMWISE_KEYS = (
    "custom_keys",
    "bias_lr_mult",
    "bias_decay_mult",
    "norm_decay_mult",
    "dwconv_decay_mult",
    "bypass_duplicate",
)
CUSTOM_KEY_FIELDS = ("lr_mult", "decay_mult")
NORM_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm, nn.GroupNorm, nn.LayerNorm)


def _is_depthwise(module: nn.Module) -> bool:
    # every input channel has its own filter; a plain 1-channel conv (groups=1) does not count
    return isinstance(module, nn.modules.conv._ConvNd) and module.groups > 1 and module.groups == module.in_channels


def _validate(cfg: dict[str, Any]) -> None:
    unknown = sorted(set(cfg) - set(PARAMWISE_KEYS))
    if unknown:
        raise ConfigError(f"optim.paramwise: unknown key {unknown[0]!r}; allowed: {', '.join(PARAMWISE_KEYS)}")
    custom = cfg.get("custom_keys") or {}
    if not isinstance(custom, dict):
        raise ConfigError(f"optim.paramwise.custom_keys={custom!r}: expected a mapping key -> {{lr_mult, decay_mult}}")
    for key, fields in custom.items():
        bad = sorted(set(fields or {}) - set(CUSTOM_KEY_FIELDS)) if isinstance(fields, dict) else [repr(fields)]
        if bad:
            raise ConfigError(
                f"optim.paramwise.custom_keys.{key}: unknown field {bad[0]}; allowed: lr_mult, decay_mult"
            )


def _multipliers(
    name: str, param_name: str, module: nn.Module, cfg: dict[str, Any], sorted_keys: list[str]
) -> tuple[float, float]:
    """(lr_mult, decay_mult) of one parameter; `name` is its full dotted name, `param_name` its last part."""
    custom = cfg.get("custom_keys") or {}
    for key in sorted_keys:  # longest first, ties alphabetical: the first hit wins and the other rules are off
        if key in name:
            fields = custom[key] or {}
            return float(fields.get("lr_mult", 1.0)), float(fields.get("decay_mult", 1.0))
    is_norm = isinstance(module, NORM_LAYERS)
    is_bias = param_name == "bias"
    lr_mult = float(cfg.get("bias_lr_mult", 1.0)) if is_bias and not is_norm else 1.0
    if is_norm:
        decay_mult = float(cfg.get("norm_decay_mult", 1.0))
    elif _is_depthwise(module):
        decay_mult = float(cfg.get("dwconv_decay_mult", 1.0))
    elif is_bias:
        decay_mult = float(cfg.get("bias_decay_mult", 1.0))
    else:
        decay_mult = 1.0
    return lr_mult, decay_mult


def build_param_groups(
    model: nn.Module, base_lr: float, base_wd: Optional[float], paramwise: Optional[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Optimizer param groups: one per distinct (lr, weight_decay), so batched optimizers keep batching.

    Each group has `params`, `param_names`, `lr`, `weight_decay` (only when `base_wd` is not None) and a
    `name`: "default" for parameters at the base values, else e.g. "lr_x10_wd_x0" (the TensorBoard tag
    `lr/<name>`). Frozen parameters are left out. With a paramwise config, a parameter reached by two names
    is an error (its rules could differ) unless `bypass_duplicate` is true, which keeps the first occurrence;
    without one it is kept once, as `model.parameters()` does. Raises ConfigError on unknown keys.
    """
    cfg = dict(paramwise or {})
    _validate(cfg)
    sorted_keys = sorted(sorted(cfg.get("custom_keys") or {}), key=len, reverse=True)
    seen: dict[int, str] = {}
    groups: dict[tuple[float, float], dict[str, Any]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for param_name, param in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            if not param.requires_grad:
                continue
            if id(param) in seen:  # tied weights, or one module reached by two names
                if not cfg or cfg.get("bypass_duplicate", False):
                    continue
                raise ConfigError(
                    f"parameter {name} is the same tensor as {seen[id(param)]}; "
                    "set optim.paramwise.bypass_duplicate=true to optimise it once"
                )
            seen[id(param)] = name
            mults = _multipliers(name, param_name, module, cfg, sorted_keys) if cfg else (1.0, 1.0)
            group = groups.get(mults)
            if group is None:
                group = groups[mults] = {
                    "name": _group_name(*mults),
                    "params": [],
                    "param_names": [],
                    "lr": base_lr * mults[0],
                }
                if base_wd is not None:
                    group["weight_decay"] = base_wd * mults[1]
            group["params"].append(param)
            group["param_names"].append(name)
    return list(groups.values())


def _group_name(lr_mult: float, decay_mult: float) -> str:
    parts = [f"lr_x{lr_mult:g}" if lr_mult != 1.0 else "", f"wd_x{decay_mult:g}" if decay_mult != 1.0 else ""]
    return "_".join(p for p in parts if p) or "default"
