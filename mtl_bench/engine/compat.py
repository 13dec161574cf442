"""Combinations of parts that build but make no sense together, refused at build time with one line."""

from __future__ import annotations

from typing import Any, Mapping

from mtl_bench.errors import ConfigError
from mtl_bench.models import MultiTaskModel


def check_model_balancer(model: MultiTaskModel, balancer: Mapping[str, Any]) -> None:
    """A balancer working at the shared representation (`grad_source: shared_rep`) needs one that the tasks share:
    architectures whose `shared` stacks one representation per task (cross-stitch: each task reads its own column)
    give per-task gradients that never overlap."""
    problem = model.shared_rep_problem()
    if balancer.get("grad_source") == "shared_rep" and problem is not None:
        raise ConfigError(f"balancer.grad_source=shared_rep: {problem}")
