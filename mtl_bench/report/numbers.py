"""How the report writes numbers and a run's model selection: shared by the wide and the compact tables and the
end-of-run summary."""

from __future__ import annotations

import math
from typing import Any


def significant(x: float, digits: int) -> str:
    """`x` to `digits` significant digits as %g does, but large values as whole numbers (2742, 130: not 2.742e+03)."""
    if math.isfinite(x) and abs(float(f"{x:.{digits}g}")) >= 10**digits:
        return f"{float(f'{x:.{digits}g}'):.0f}"
    return f"{x:.{digits}g}"


def selection_text(record: Any) -> str:
    """A run's model selection (select=<option>) as metrics.json records it, in words."""
    if not isinstance(record, dict):
        return str(record or "final step")
    if record.get("select") == "best_val":
        return f"best validation {record.get('criterion')}"
    if record.get("select") == "last_k":
        return f"mean of the last {record.get('k')} evaluations"
    return "final step"
