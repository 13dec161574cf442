"""Every TensorBoard tag name in one place. The task is always the last path
component, so one regex collects a family's tasks (see loggers/tensorboard.py dashboard_layout)."""

from __future__ import annotations


def loss(task: str) -> str:
    return f"loss/{task}"


def weight(task: str) -> str:
    return f"weight/{task}"


def preference(task: str) -> str:
    return f"preference/{task}"


def ratio(task: str) -> str:
    """rescaled_norm's (EnCodec's ratio_k): the task's share of the averaged raw gradient norms at the shared output.
    GradNorm's share of the weighted norms is `gradnorm/norm_share/<task>`: one meaning per tag."""
    return f"ratio/{task}"


def grad_norm(task: str) -> str:
    return f"grad_norm/{task}"


def grad_cos(a: str, b: str) -> str:
    return f"grad_cos/{a}/{b}"


def metric(split: str, task: str, name: str) -> str:
    return f"metric/{split}/{task}/{name}"


def front(split: str, indicator: str) -> str:
    """An indicator of a preference-conditioned model's front (engine/front_evaluation.py); image is `front/<split>`."""
    return f"front/{split}/{indicator}"


def lr(group: str | int) -> str:
    return f"lr/{group}"


def momentum(group: str | int) -> str:
    return f"momentum/{group}"


GRAD_NORM_TOTAL = "grad_norm/total"
LOSS_SCALE = "amp/loss_scale"
STEPS_PER_S = "perf/steps_per_s"
STEPS_SKIPPED = "steps/skipped"
TEST_LOSS_RATIO_SUM = "summary/test_loss_ratio_sum"
