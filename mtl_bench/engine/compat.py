"""Combinations of parts that build but make no sense together, refused at build time with one line."""

from __future__ import annotations

from typing import Any, Mapping

from mtl_bench.errors import ConfigError
from mtl_bench.models import MultiTaskModel


def check_model_balancer(model: MultiTaskModel, balancer: object, node: Mapping[str, Any]) -> None:
    """A balancer working at the shared representation (`grad_source: shared_rep`, or GradDrop, which has no other
    source) needs one that the tasks share: architectures whose `shared` stacks one representation per task
    (cross-stitch: each task reads its own column) give per-task gradients that never overlap. `balancer` is the
    built one (its `grad_source`), `node` its config (whether the user chose the source)."""
    problem = model.shared_rep_problem()
    if problem is None or getattr(balancer, "grad_source", None) != "shared_rep":
        return
    if "grad_source" in node:
        raise ConfigError(f"balancer.grad_source=shared_rep: {problem}")
    reason = problem.removesuffix("; use grad_source=shared_params")  # no advice it could follow
    raise ConfigError(f"balancer: {type(balancer).__name__} works at the shared representation only: {reason}")
