"""The balancers' option checks (mtl_bench/balancers/checks.py): what they accept, and the one line they refuse with."""

from __future__ import annotations

import pytest

from mtl_bench.balancers.checks import at_least, number, one_of, pair


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: number("lr", 0, 0, above=True), "lr: must be a number > 0, got 0"),
        (lambda: number("beta", 1.0, 0, 1, below=True), "beta: must be a number in [0, 1), got 1.0"),
        (lambda: number("decay", 0.0, 0, 1, above=True), "decay: must be a number in (0, 1], got 0.0"),
        (lambda: number("x", 2, high=1), "x: must be a number <= 1, got 2"),
        (lambda: number("x", float("nan")), "x: must be a number, got nan"),
        (lambda: number("x", True, 0), "x: must be a number >= 0, got True"),  # a bool is no number here
        (lambda: number("x", "1", 0), "x: must be a number >= 0, got '1'"),
        (lambda: number("steps", 2.5, 1, integer=True), "steps: must be an integer >= 1, got 2.5"),
        (lambda: number("z", float("inf"), finite=True), "z: must be a finite number, got inf"),
        (lambda: number("seed", "a", integer=True, null=True), "seed: must be an integer or null, got 'a'"),
        (
            lambda: number("trim", 2, 0, 1, integer=True, note="for 3 tasks (at most (T - 1) // 2)"),
            "trim: must be an integer in [0, 1] for 3 tasks (at most (T - 1) // 2), got 2",
        ),
        (lambda: at_least("eps", -1, 0), "eps: must be a number >= 0, got -1"),
        (lambda: pair("betas", (0.9, 1.0), 0, 1, below=True), "betas: must be two numbers in [0, 1), got (0.9, 1.0)"),
        (lambda: pair("betas", [0.9], 0, 1, below=True), "betas: must be two numbers in [0, 1), got [0.9]"),
        (lambda: pair("betas", "ab", 0, 1), "betas: must be two numbers in [0, 1], got 'ab'"),
        (lambda: one_of("mode", "x", ("a", "b")), "mode: 'x' is not one of a, b"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_option(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == message


def test_good_values_come_back_as_their_type():
    assert number("lr", 1, 0, above=True) == 1.0 and isinstance(number("lr", 1, 0, above=True), float)
    assert number("steps", 3, 1, integer=True) == 3 and isinstance(number("steps", 3, 1, integer=True), int)
    assert number("seed", None, integer=True, null=True) is None
    assert number("x", float("inf")) == float("inf")  # unbounded and not `finite`: infinity is a number
    assert number("decay", 1, 0, 1, above=True) == 1.0
    assert pair("betas", [0.9, 0], 0, 1, below=True) == (0.9, 0.0)
    assert one_of("mode", "b", ("a", "b")) == "b"
