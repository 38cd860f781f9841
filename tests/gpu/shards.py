"""`--shard I/N`: the I-th of N parts of the collected tests, every N-th test from the I-th (so that
a module's parametrized cases, which cost alike, spread over the parts). For machines that limit a
command's time: N commands, one part each, run the whole suite. Loaded by tests/gpu/conftest.py."""

from __future__ import annotations

import re

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", metavar="I/N", help="run the I-th of N parts of the tests (1 <= I <= N)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = config.getoption("--shard")
    if shard is None:
        return
    m = re.fullmatch(r"(\d+)/(\d+)", shard)
    if m is None or not 1 <= int(m[1]) <= int(m[2]):
        raise pytest.UsageError(f"--shard: expected I/N with 1 <= I <= N, got {shard!r}")
    part, parts = int(m[1]) - 1, int(m[2])
    config.hook.pytest_deselected(items=[item for n, item in enumerate(items) if n % parts != part])
    items[:] = items[part::parts]
