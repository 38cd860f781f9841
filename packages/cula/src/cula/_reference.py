"""Float64 reference of the simple_gla recurrence, for the self-test and the tests.

Works on NumPy arrays and torch tensors alike (``xp`` is the module: numpy or torch). The chunked
form below is exact algebra of S_t = gamma S_{t-1} + k_t^T v_t, o_t = scale q_t S_t;
``recurrent_reference`` is the plain token loop it is checked against.
"""

from __future__ import annotations

__all__ = ["simple_gla_reference", "recurrent_reference", "rms_ratio"]


def _f64(xp, x):
    return x.astype(xp.float64) if hasattr(x, "astype") and xp.__name__ == "numpy" else x.double()


def simple_gla_reference(xp, q, k, v, g_gamma=None, scale=None, initial_state=None, cu_seqlens=None, chunk=64):
    """q, k [B,T,H,K], v [B,T,H,V] -> (o [B,T,H,V] float64, final state [N,H,K,V] float64)."""
    q, k, v = _f64(xp, q), _f64(xp, k), _f64(xp, v)
    batch, total, heads, dk = q.shape
    scale = dk ** -0.5 if scale is None else scale
    if cu_seqlens is None:
        bounds = [(b, 0, total) for b in range(batch)]
    else:
        cu = [int(x) for x in cu_seqlens]
        bounds = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    g = xp.zeros(heads, dtype=xp.float64) if g_gamma is None else _f64(xp, g_gamma)
    if xp.__name__ != "numpy":
        g = g.to(q.device)
    o = q.new_zeros(v.shape) if xp.__name__ != "numpy" else xp.zeros(v.shape)
    states = []
    for n, (b, start, end) in enumerate(bounds):
        if initial_state is None:
            s = xp.zeros((heads, dk, v.shape[-1]), dtype=xp.float64)
            if xp.__name__ != "numpy":
                s = s.to(q.device)
        else:
            s = _f64(xp, initial_state[n])
        for c0 in range(start, end, chunk):
            c1 = min(c0 + chunk, end)
            length = c1 - c0
            qc, kc, vc = q[b, c0:c1], k[b, c0:c1], v[b, c0:c1]
            i = xp.arange(length, dtype=xp.float64)
            if xp.__name__ != "numpy":
                i = i.to(q.device)
            diff = i[:, None] - i[None, :]
            mask = diff >= 0
            decay = xp.exp(g[:, None, None] * xp.where(mask, diff, 0 * diff)[None]) * mask[None]
            att = xp.einsum("ihk,jhk->hij", qc, kc) * decay
            inter = xp.exp(g[:, None] * (i[None, :] + 1)).T[:, :, None] * xp.einsum("ihk,hkv->ihv", qc, s)
            o[b, c0:c1] = scale * (xp.einsum("hij,jhv->ihv", att, vc) + inter)
            w = xp.exp(g[:, None] * (length - 1 - i[None, :]))  # [H, L]
            s = xp.exp(g * length)[:, None, None] * s + xp.einsum("jhk,jhv,hj->hkv", kc, vc, w)
        states.append(s)
    return o, xp.stack(states)


def recurrent_reference(xp, q, k, v, g_gamma=None, scale=None, initial_state=None):
    """The token loop, one sequence per batch row (for checking simple_gla_reference)."""
    q, k, v = _f64(xp, q), _f64(xp, k), _f64(xp, v)
    batch, total, heads, dk = q.shape
    scale = dk ** -0.5 if scale is None else scale
    gamma = xp.exp(xp.zeros(heads) if g_gamma is None else _f64(xp, g_gamma))
    o = xp.zeros(v.shape)
    states = []
    for b in range(batch):
        s = xp.zeros((heads, dk, v.shape[-1])) if initial_state is None else _f64(xp, initial_state[b]).copy()
        for t in range(total):
            s = gamma[:, None, None] * s + k[b, t][:, :, None] * v[b, t][:, None, :]
            o[b, t] = scale * xp.einsum("hk,hkv->hv", q[b, t], s)
        states.append(s)
    return o, xp.stack(states)


def rms_ratio(ref, out) -> float:
    """RMS(ref - out) / RMS(ref), FLA's correctness metric."""
    diff = ((ref - out) ** 2).mean() ** 0.5
    base = (ref ** 2).mean() ** 0.5
    return float(diff / base) if float(base) > 0 else float(diff)
