"""Fixtures of the fast-path tests (test_fast_path.py, test_gated_fast_path.py): the fast path set
up as a first plain call sets it up, calls of the public API with it switched off, and the check of
a sequence call the fast path declined; the option --shard (shards.py)."""

from __future__ import annotations

import pytest
from shards import pytest_addoption, pytest_collection_modifyitems  # noqa: F401  (--shard I/N)

# cula._fast's entry points, one per C function of the fast path (native/src/*_fastpath.cpp)
FAST_ENTRY_POINTS = ("decode", "sequence", "gated_sequence", "gated_decode")


@pytest.fixture
def fast():
    """cula._fast with every entry point on, set up by a first plain call."""
    import cula
    import torch
    from cula import _fast
    q = torch.zeros(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16)
    cula.chunk_simple_gla(q, q, q)
    off = [name for name in FAST_ENTRY_POINTS if getattr(_fast, name) is None]
    assert not off, f"the fast path was not set up: {off}"
    return _fast


@pytest.fixture
def python_path(monkeypatch):
    """Calls the public API with the fast path switched off (every entry point)."""
    from cula import _fast

    def call(fn, *args, **kwargs):
        with monkeypatch.context() as m:
            for name in FAST_ENTRY_POINTS:
                m.setattr(_fast, name, None)
            return fn(*args, **kwargs)
    return call


@pytest.fixture
def declined_like_python(python_path):
    """check(fn, a, outcome, name) for a sequence call `fn(**a)` the fast path declined: with outcome
    None it gives the Python path's (o, final state) bit for bit, else it raises the Python path's
    error of type `outcome` (a `cula` message)."""
    import torch

    def check(fn, a, outcome, name):
        if outcome is None:
            o, ht = fn(**a)
            o_py, ht_py = python_path(fn, **a)
            torch.cuda.synchronize()
            assert torch.equal(o, o_py) and torch.equal(ht, ht_py), name
        else:
            with pytest.raises(outcome, match=r"^cula"):
                fn(**a)
    return check
