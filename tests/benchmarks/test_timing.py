"""benchmarks.timing: interleaved rounds, medians, tables."""

from __future__ import annotations

import pytest

from benchmarks.timing import interleaved, markdown_table, medians, ratio, seconds_per_call


def test_interleaved_alternates_the_order_and_collects_each_variants_values() -> None:
    calls: list[str] = []

    def variant(name: str, value: float):
        def run() -> float:
            calls.append(name)
            return value + len(calls)

        return run

    results = interleaved({"a": variant("a", 0.0), "b": variant("b", 100.0)}, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert results == {"a": [1.0, 4.0, 5.0], "b": [102.0, 103.0, 106.0]}
    assert medians(results) == {"a": 4.0, "b": 103.0}
    with pytest.raises(ValueError, match="rounds"):
        interleaved({"a": variant("a", 0.0)}, rounds=0)


def test_seconds_per_call_is_the_mean_over_the_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([10.0, 16.0])
    monkeypatch.setattr("benchmarks.timing.time.perf_counter", lambda: next(clock))
    count = []
    assert seconds_per_call(lambda: count.append(1), 3) == 2.0
    assert len(count) == 3


def test_markdown_table_right_aligns_numeric_columns_and_checks_row_lengths() -> None:
    table = markdown_table(
        ["name", "ms", "x base"], [["fixed", "1.5", ratio(1.5, 1.5)], ["gradnorm", 3, ratio(3, 1.5)]]
    )
    assert table.splitlines() == [
        "| name | ms | x base |",
        "|---|---:|---:|",
        "| fixed | 1.5 | 1.00x |",
        "| gradnorm | 3 | 2.00x |",
    ]
    with pytest.raises(ValueError, match="2 cells, the header 3"):
        markdown_table(["a", "b", "c"], [["1", "2"]])
