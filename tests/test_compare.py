"""The table of `tests/run.py --compare` (two builds timed in turns on the GPU machine): each
config's times per round, the ratio of their medians, and whether the outputs' sums agree, read from
what benchmarks/bench.py writes into its JSON (the "ms" and "sums" of each config)."""

from __future__ import annotations

import run


def config(ms: dict[str, float], sums: list[float]) -> dict:
    return {"ms": ms, "sums": sums}


def rows(table: str) -> list[list[str]]:
    lines = table.splitlines()
    assert lines[0] == "| config | variant | old ms | new ms | new / old | outputs |"
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_rounds_medians_and_equal_sums():
    # (medians, not means: one slow round must not decide)
    old = [{"A": config({"sm90a": 2.0, "generic": 3.0}, [1.5, -2.25])},
           {"A": config({"sm90a": 2.6, "generic": 3.3}, [1.5, -2.25])},
           {"A": config({"sm90a": 2.1, "generic": 4.5}, [1.5, -2.25])}]
    new = [{"A": config({"sm90a": 1.0, "generic": 3.0}, [1.5, -2.25])},
           {"A": config({"sm90a": 1.2, "generic": 3.0}, [1.5, -2.25])},
           {"A": config({"sm90a": 1.1, "generic": 3.0}, [1.5, -2.25])}]
    assert rows(run.compare_table(old, new)) == [
        ["A", "sm90a", "2.0000, 2.6000, 2.1000", "1.0000, 1.2000, 1.1000", "0.524", "same"],
        ["A", "generic", "3.0000, 3.3000, 4.5000", "3.0000, 3.0000, 3.0000", "0.909", "same"],
    ]


def test_different_sums_are_reported_with_their_relative_difference():
    old = [{"A": config({"sm90a": 1.0}, [100.0, 4.0]), "B": config({"sm90a": 1.0}, [1.0])}]
    new = [{"A": config({"sm90a": 1.0}, [100.0, 4.002]), "B": config({"sm90a": 1.0}, [1.0, 2.0])}]
    (a,), (b,) = ([r] for r in rows(run.compare_table(old, new)))
    assert a[-1] == "differ (sums, relative: 5.0e-04)" and a[-2] == "1.000"
    assert b[-1] == "differ (not the same outputs)"


def test_configs_of_one_build_only_are_left_out():
    old = [{"A": config({"sm90a": 1.0}, [1.0]), "gone": config({"sm90a": 1.0}, [1.0])}]
    new = [{"A": config({"sm90a": 0.5}, [1.0]), "added": config({"sm90a": 1.0}, [1.0])}]
    assert [r[0] for r in rows(run.compare_table(old, new))] == ["A"]
