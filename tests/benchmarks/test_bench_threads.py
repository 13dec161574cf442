"""scripts/bench_threads.py's ratio of interleaved pairs: the median of each round's ratio, not the ratio of medians."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_threads.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_threads", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pair_ratio_is_the_median_of_each_rounds_ratio():
    # the rounds' ratios 2, 1, 3: median 2 (the ratio of the medians, 4 / 3, would say 1.33)
    assert load().pair_ratio([2.0, 4.0, 9.0], [1.0, 4.0, 3.0]) == "2.00x"
