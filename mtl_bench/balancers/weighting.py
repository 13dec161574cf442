"""What a Gramian method returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch import Tensor


@dataclass
class Solution:
    """What a method's solve returns: the shared direction's weights (on the device, (T,) or one row per
    block (K, T)), the heads' weights (None: 1 each) and the method's own measurements."""

    weights: Tensor
    head_weights: Optional[Tensor] = None
    metrics: dict[str, Tensor] = field(default_factory=dict)
