"""Float64 reference of the simple_gla recurrence, for the self-test and the tests.

Works on NumPy arrays and torch tensors alike (``xp`` is the module: numpy or torch). The chunked
form below is exact algebra of S_t = gamma S_{t-1} + k_t^T v_t, o_t = scale q_t S_t;
``recurrent_reference`` is the plain token loop it is checked against.
"""

from __future__ import annotations

__all__ = ["gated_delta_rule_reference", "simple_gla_reference", "recurrent_reference", "rms_ratio"]


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


def gated_delta_rule_reference(q, k, v, g=None, beta=None, scale=None, initial_state=None, cu_seqlens=None,
                               l2norm=False, A_log=None, dt_bias=None, beta_sigmoid=False, beta_scale=1.0, delta=True,
                               token_states=False, lower_bound=None, gate_in_kernel=None):
    """The gated delta rule token by token in float64 (torch tensors; FLA's naive_recurrent_gated_delta_rule
    with its options): q, k [B,T,H,K], v [B,T,HV,V], g, beta [B,T,HV] -> (o [B,T,HV,V], final states
    [N,HV,K,V]) and, with token_states, the state after every token [B*T,HV,K,V]. delta=False is
    simple_gla with a per-token gate. A per-key g [B,T,HV,K] is KDA (FLA's naive_recurrent_kda), its
    dt_bias [HV*K] or [HV,K]. The gate is computed from g when gate_in_kernel (default: A_log given):
    -exp(A_log) softplus(g + dt_bias), or lower_bound sigmoid(exp(A_log) (g + dt_bias)) (factor 1
    without A_log)."""
    import torch
    q, k, v = q.double(), k.double(), v.double()
    batch, total, heads, dk = q.shape
    v_heads = v.shape[2]
    group = v_heads // heads
    scale = dk ** -0.5 if scale is None else scale
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    g = torch.zeros(batch, total, v_heads, dtype=torch.float64, device=q.device) if g is None else g.double()
    per_key = g.dim() == 4
    if A_log is not None if gate_in_kernel is None else gate_in_kernel:
        shape = (v_heads, dk) if per_key else (v_heads,)
        x = g + (0.0 if dt_bias is None else dt_bias.double().reshape(shape))
        a = 1.0 if A_log is None else torch.exp(A_log.double()).reshape(v_heads, *((1,) if per_key else ()))
        if lower_bound is None:
            g = -a * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
        else:
            g = lower_bound * torch.sigmoid(a * x)
    beta = torch.ones_like(g) if beta is None else beta.double()
    if beta_sigmoid:
        beta = beta_scale * torch.sigmoid(beta)
    if cu_seqlens is None:
        bounds = [(b, 0, total) for b in range(batch)]
    else:
        cu = [int(x) for x in cu_seqlens]
        bounds = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    finals, per_token = [], torch.zeros(batch * total, v_heads, dk, v.shape[-1], dtype=torch.float64,
                                         device=q.device) if token_states else None
    for n, (b, start, end) in enumerate(bounds):
        s = (torch.zeros(v_heads, dk, v.shape[-1], dtype=torch.float64, device=q.device) if initial_state is None
             else initial_state[n].double().clone())
        for t in range(start, end):
            s = torch.exp(g[b, t])[..., None] * s if per_key else torch.exp(g[b, t])[:, None, None] * s
            vt = v[b, t]
            if delta:
                vt = beta[b, t][:, None] * (vt - torch.einsum("hk,hkv->hv", k[b, t], s))
            s = s + k[b, t][:, :, None] * vt[:, None, :]
            o[b, t] = scale * torch.einsum("hk,hkv->hv", q[b, t], s)
            if token_states:
                per_token[b * total + t] = s
        finals.append(s)
    out = (o, torch.stack(finals))
    return (*out, per_token) if token_states else out

