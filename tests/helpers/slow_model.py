"""An MLP whose forward sleeps, for tests that need a step slow enough to signal into (`model._target_=
tests.helpers.slow_model.SlowMLP` on the command line, repository root on PYTHONPATH). Environment, so that a
resumed run has the same config: SLOW_FORWARD_S, the sleep; SLOW_FORWARD_STAMPS, a file that gets one line
`<train|eval> <start|end> <time.time()>` per forward."""

from __future__ import annotations

import os
import time
from typing import Any

from mtl_bench.models import MLP, ModelOutput


class SlowMLP(MLP):
    def forward(self, x: Any, *args: Any, **kwargs: Any) -> ModelOutput:
        mode = "train" if self.training else "eval"
        self._stamp(mode, "start")
        time.sleep(float(os.environ.get("SLOW_FORWARD_S", "0")))
        out = super().forward(x, *args, **kwargs)
        self._stamp(mode, "end")
        return out

    @staticmethod
    def _stamp(mode: str, what: str) -> None:
        path = os.environ.get("SLOW_FORWARD_STAMPS")
        if path:
            with open(path, "a") as f:
                f.write(f"{mode} {what} {time.time():.6f}\n")
