"""The console's step rate: steps per second when fast, seconds per step when a step takes longer than one."""

import pytest

from mtl_bench.engine.progress import speed


@pytest.mark.parametrize(
    ("steps_per_s", "text"),
    [(12.4, "12 steps/s"), (1.0, "1 steps/s"), (0.4, "2.5 s/step"), (1 / 28.1, "28 s/step"), (0.0, "no step finished")],
)
def test_speed_never_rounds_a_slow_rate_to_zero(steps_per_s, text):
    assert speed(steps_per_s) == text
