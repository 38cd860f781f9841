"""The float64 chunked reference (used by the GPU tests and the self-test) against the plain
token loop of the recurrence, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
from cula._reference import recurrent_reference, rms_ratio, simple_gla_reference


@pytest.mark.parametrize("total", [1, 5, 64, 65, 130])
@pytest.mark.parametrize("decay", [None, "random"])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_reference_equals_token_loop(total, decay, with_state):
    rng = np.random.default_rng(total)
    b, h, d = 2, 3, 8
    q, k, v = (rng.standard_normal((b, total, h, d)) for _ in range(3))
    g = None if decay is None else -rng.random(h)
    h0 = rng.standard_normal((b, h, d, d)) if with_state else None
    o1, s1 = simple_gla_reference(np, q, k, v, g, 0.7, h0, chunk=16)
    o2, s2 = recurrent_reference(np, q, k, v, g, 0.7, h0)
    np.testing.assert_allclose(o1, o2, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(s1, s2, rtol=1e-10, atol=1e-10)


def test_varlen_reference_is_per_sequence():
    rng = np.random.default_rng(0)
    lens = [3, 0, 20]
    q, k, v = (rng.standard_normal((1, sum(lens), 2, 4)) for _ in range(3))
    g = -rng.random(2)
    h0 = rng.standard_normal((3, 2, 4, 4))
    o, s = simple_gla_reference(np, q, k, v, g, None, h0, cu_seqlens=[0, 3, 3, 23], chunk=8)
    for n, (a, e) in enumerate([(0, 3), (3, 3), (3, 23)]):
        o_n, s_n = recurrent_reference(np, q[:, a:e], k[:, a:e], v[:, a:e], g, None, h0[n:n + 1])
        np.testing.assert_allclose(o[:, a:e], o_n, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(s[n], s_n[0], rtol=1e-10, atol=1e-12)


def test_rms_ratio():
    ref = np.ones(100)
    assert rms_ratio(ref, ref) == 0
    assert rms_ratio(ref, ref * 1.01) == pytest.approx(0.01)
