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


@pytest.mark.parametrize("gate", ["g", "softplus", "lower_bound", "lower_bound_no_A_log"])
def test_kda_reference_against_fla_naive(gate):
    """The per-key gate (KDA) of gated_delta_rule_reference against FLA's own torch references
    (naive_recurrent_kda, and its gate functions for the in-kernel gates), GVA and a state."""
    torch = pytest.importorskip("torch")
    naive = pytest.importorskip("fla.ops.kda.naive")
    fla_gate = pytest.importorskip("fla.ops.kda.gate")
    from cula._reference import gated_delta_rule_reference
    gen = torch.Generator().manual_seed(1)
    b, t, h, hv, d = 2, 9, 2, 4, 8
    q, k = (torch.randn(b, t, h, d, generator=gen, dtype=torch.float64) for _ in range(2))
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(b, t, hv, d, generator=gen, dtype=torch.float64)
    raw = torch.randn(b, t, hv, d, generator=gen, dtype=torch.float64)
    beta = torch.rand(b, t, hv, generator=gen, dtype=torch.float64)
    h0 = torch.randn(b, hv, d, d, generator=gen, dtype=torch.float64)
    A_log = torch.rand(hv, generator=gen, dtype=torch.float64)
    dt_bias = torch.randn(hv * d, generator=gen, dtype=torch.float64)
    kw = {}
    if gate == "g":
        g = -torch.rand(b, t, hv, d, generator=gen, dtype=torch.float64)
    elif gate == "softplus":
        g = fla_gate.naive_kda_gate(raw, A_log, dt_bias, output_dtype=torch.float64)
        kw = dict(A_log=A_log, dt_bias=dt_bias)
    else:
        a = A_log if gate == "lower_bound" else None
        g = fla_gate.naive_kda_lowerbound_gate(raw, a, dt_bias, -3.0, output_dtype=torch.float64)
        kw = dict(A_log=a, dt_bias=dt_bias, lower_bound=-3.0, gate_in_kernel=True)
    o_ref, s_ref = naive.naive_recurrent_kda(q, k, v, g, beta, 0.3, h0, True)  # (computes in float32)
    o, s = gated_delta_rule_reference(q, k, v, g if gate == "g" else raw, beta, 0.3, h0, **kw)
    torch.testing.assert_close(o, o_ref.double(), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(s, s_ref.double(), rtol=2e-5, atol=2e-5)
