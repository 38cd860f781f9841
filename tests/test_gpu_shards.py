"""The GPU suite's `--shard I/N` (tests/gpu/shards.py), on a suite of its own: N parts that together
hold every test once, of sizes within one of each other, and a clear error for a bad value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'tests' / 'gpu')!r})\n"
        "from shards import pytest_addoption, pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "test_a.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('n', range(10))\ndef test_p(n):\n    pass\n\n"
        "def test_one():\n    pass\n")
    (tmp_path / "test_b.py").write_text("def test_x():\n    pass\n\ndef test_y():\n    pass\n")
    return tmp_path


def collect(suite: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(suite), "-c", "/dev/null", str(suite), *args],
                          capture_output=True, text=True, cwd=suite)


def ids(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_parts_hold_every_test_once(suite: Path):
    everything = ids(collect(suite))
    assert len(everything) == 13
    parts = [ids(collect(suite, "--shard", f"{i}/3")) for i in (1, 2, 3)]
    assert sorted(sum(parts, [])) == sorted(everything)
    assert sorted(len(p) for p in parts) == [4, 4, 5]
    # every third test: a module's parametrized cases spread over the parts
    assert [sum("test_p[" in t for t in p) for p in parts] == [4, 3, 3]


@pytest.mark.parametrize("bad", ["0/3", "4/3", "1", "a/b", "1/0"])
def test_bad_value(suite: Path, bad: str):
    result = collect(suite, "--shard", bad)
    assert result.returncode == 4  # pytest's usage error
    assert f"--shard: expected I/N with 1 <= I <= N, got '{bad}'" in result.stderr
