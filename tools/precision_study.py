"""How much each 16-bit rounding of the chunked gated delta rule costs in accuracy, without a GPU.

    python tools/precision_study.py [--heads 2] [--quick]

The two-launch kernels' arithmetic (notes/gated-delta-rule.md, session 15), per 64-token chunk, in
float64 numpy with explicit roundings where a kernel rounds: the solve of (I + A) [W | U0] = beta [K
exp(G) | V] (by 16-row blocks with tf32 products, as the prep kernel does, its right-hand sides
stored in float32 as the prep kernel stores them, or in fp16 or bf16; through an explicit
inverse, as FLA does, or through the block solve's inverse, its columns scaled and rounded, applied
to the raw K and V, as CULA_GDN_PREP=inverse does; or, for a one-launch kernel given T = (I + A)^-1
a chunk ahead, U = T X with T and X as tf32, fp16 or bf16 operands, X from the state's 16-bit copy:
session 17; or the one-launch kernel's (I + A) U = X by blocks of 16 rows, as in session 18 and
since session 57, or of 32, their inverses from the 16-row ones by tf32 products, as in sessions
19-56, those from 8-row ones too), W / Qg / Kl / Aqk in bf16, U0 in
float32 or bf16, the state and U as 16-bit operands of the chain's products, o stored in bf16. Each
variant's o and final state are compared with the token-by-token float64 recurrence, as RMS(ref -
out) / RMS(ref), the GPU tests' measure (their bound: 5e-3), on the tests' inputs (q, v ~ N(0, 1), k
~ N(0, 1/D), g in [-gmax, 0], beta in [0, 1], h0 ~ N(0, 0.01)). Independent roundings add in
quadrature; the table says which ones a kernel design can afford.

    python tools/precision_study.py --kda

The same for KDA's per-key gate (common/chunk_kda.cuh): A and Aqk from 16-bit mma operands scaled
against reference rows, as the prep forms them today (a key tile per row block, 40 KB at D = 128)
or from smaller key tiles whose left operands take one more 16-bit rounding (session 59: the
smem a prep at two CTAs an SM would need); W, U0, Qg, Kl, Aqk, the state operands and o in 16 bits.
"""

from __future__ import annotations

import argparse

import numpy as np

CHUNK = 64


def _round(x, keep_bits: int):
    """x rounded to nearest-even float32 with `keep_bits` of its 23 mantissa bits, as float64."""
    drop = 23 - keep_bits
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + (1 << (drop - 1)) - 1 + ((u >> drop) & 1)) & (0xFFFFFFFF ^ ((1 << drop) - 1))
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def bf16(x):
    return _round(x, 7)


def tf32(x):
    return _round(x, 10)


def bf16x2(x):
    """x as the sum of two bf16 numbers (hi + lo: a product's operand applied twice)."""
    hi = bf16(x)
    return hi + bf16(f32(x) - hi)


def fp16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float64)


def f32(x):
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def exact(x):
    return x


def reference(q, k, v, g, beta, h0, scale):
    """The token-by-token recurrence (FLA's naive_recurrent_gated_delta_rule, or with g [T, K] per key
    naive_recurrent_kda) in float64."""
    s = h0.copy()
    o = np.zeros_like(v)
    for t in range(len(q)):
        s = np.reshape(np.exp(g[t]), (-1, 1)) * s
        s = s + np.outer(k[t], beta[t] * (v[t] - s.T @ k[t]))
        o[t] = scale * s.T @ q[t]
    return o, s


def block_inverse(a, r, size, base=16):
    """The inverse of I + a (a diagonal block of up to `size` rows): up to `base` rows exact (the
    kernels' forward substitution in float32); larger from the inverses of its two halves,
    [d0 0; -d1 a10 d0 d1], by two products with operands rounded by r."""
    h = size // 2
    if size <= base:
        return np.linalg.inv(np.eye(len(a)) + a)
    if len(a) <= h:
        return block_inverse(a, r, h, base)
    d0, d1 = block_inverse(a[:h, :h], r, h, base), block_inverse(a[h:, h:], r, h, base)
    inv = np.zeros_like(a)
    inv[:h, :h], inv[h:, h:] = d0, d1
    inv[h:, :h] = -(r(f32(r(d1) @ r(a[h:, :h]))) @ r(d0))
    return inv


def solve_blocks(a, x, r, size=16, base=16):
    """(I + a) u = x by blocks of `size` rows (block_inverse from `base` rows), the block products
    with operands rounded by r."""
    u = np.zeros_like(x)
    for b in range(0, len(a), size):
        e = min(b + size, len(a))
        rhs = x[b:e] - (r(a[b:e, :b]) @ r(u[:b]) if b else 0)
        u[b:e] = r(block_inverse(a[b:e, b:e], r, size, base)) @ r(rhs)
    return u


def chunked(q, k, v, g, beta, h0, scale, m):
    """The chunked form with the roundings of variant m."""
    s = h0.copy()
    o = np.zeros_like(v)
    for c0 in range(0, len(q), CHUNK):
        c1 = min(c0 + CHUNK, len(q))
        qc, kc, vc, bc = q[c0:c1], k[c0:c1], v[c0:c1], beta[c0:c1]
        gc = np.cumsum(g[c0:c1])
        decay = np.exp(gc[:, None] - gc[None, :])
        a = np.tril(bc[:, None] * (kc @ kc.T) * decay, -1)
        xk, xv = bc[:, None] * kc * np.exp(gc)[:, None], bc[:, None] * vc
        s16 = m["state"](s)
        if m["solve"] in ("t_times_x", "one_launch"):  # one launch: X from the state's 16-bit copy
            x = f32(bc[:, None] * (vc - np.exp(gc)[:, None] * (kc @ s16)))
        if m["solve"] == "t_times_x":  # one launch, T = (I + A)^-1 formed a chunk ahead: U = T X
            inv = solve_blocks(a, np.eye(c1 - c0), m["tf32"])
            w, u0 = np.zeros_like(kc), m["inverse"](inv) @ m["inverse"](x)
        elif m["solve"] == "one_launch":  # (I + A) U = X by blocks of m["block"] rows
            w, u0 = np.zeros_like(kc), solve_blocks(a, x, m["tf32"], m["block"], m["base"])
        elif m["solve"] == "blocks":  # (the right-hand sides as the prep stores them: m["rhs"])
            w, u0 = solve_blocks(a, m["rhs"](xk), m["tf32"]), solve_blocks(a, m["rhs"](xv), m["tf32"])
        elif m["solve"] == "apply":  # the inverse by blocks, its columns scaled, times the raw k and v
            inv = solve_blocks(a, np.eye(c1 - c0), m["tf32"])
            w, u0 = m["inverse"](inv * (bc * np.exp(gc))[None, :]) @ kc, m["inverse"](inv * bc[None, :]) @ vc
        else:
            inv = m["inverse"](np.linalg.inv(np.eye(c1 - c0) + a))
            w, u0 = inv @ m["inverse"](xk), inv @ m["inverse"](xv)
        w, u0 = m["tiles"](w), m["u0"](u0)
        qg = m["tiles"](scale * qc * np.exp(gc)[:, None])
        kl = m["tiles"](kc * np.exp(gc[-1] - gc)[:, None])
        aqk = m["tiles"](scale * np.tril((qc @ kc.T) * decay))
        u16 = m["state"](f32(u0 - w @ s16))
        o[c0:c1] = m["o"](qg @ s16 + aqk @ u16)
        s = np.exp(gc[-1]) * s + kl.T @ u16
    return o, s


def variant(solve="blocks", tf32_solve=False, inverse=exact, tiles=exact, u0=exact, state=exact, o=exact, block=16,
            base=16, rhs=f32):
    return {"solve": solve, "tf32": tf32 if tf32_solve else exact, "inverse": inverse, "tiles": tiles, "u0": u0,
            "state": state, "o": o, "block": block, "base": base, "rhs": rhs}


NOW = dict(tf32_solve=True, tiles=bf16, u0=f32, state=bf16, o=bf16)
VARIANTS = {
    "no rounding (float32 U)": variant(),
    "o stored in bf16 only": variant(o=bf16),
    "state and U as bf16 operands only": variant(state=bf16),
    "W, Qg, Kl, Aqk in bf16 only": variant(tiles=bf16),
    "tf32 block solve only": variant(tf32_solve=True),
    "inverse and right-hand sides in bf16 only": variant(solve="inverse", inverse=bf16),
    "U0 in bf16 only": variant(u0=bf16),
    "the kernels today (all of: tf32 solve, tiles, state, o; U0 float32)": variant(**NOW),
    "today, U0 in bf16": variant(**{**NOW, "u0": bf16}),
    "today, the right-hand sides (beta K exp(G), beta V) stored in bf16 (half the prep's X)": variant(**NOW, rhs=bf16),
    "today, the right-hand sides stored in fp16": variant(**NOW, rhs=fp16),
    "today, the solve by a bf16 inverse": variant(**{**NOW, "tf32_solve": False}, solve="inverse", inverse=bf16),
    "today, a bf16 inverse and U0 in bf16 (as FLA)": variant(**{**NOW, "tf32_solve": False, "u0": bf16},
                                                            solve="inverse", inverse=bf16),
    "today, the tf32 inverse's scaled columns in bf16 applied to k and v": variant(**NOW, solve="apply",
                                                                                    inverse=bf16),
    "today, the same as bf16 hi + lo (two products)": variant(**NOW, solve="apply", inverse=bf16x2),
    "today, one launch with T ahead: U = T X, both tf32": variant(**NOW, solve="t_times_x", inverse=tf32),
    "today, one launch with T ahead: U = T X, both fp16": variant(**NOW, solve="t_times_x", inverse=fp16),
    "today, one launch with T ahead: U = T X, both bf16": variant(**NOW, solve="t_times_x", inverse=bf16),
    "today, one launch by 16-row blocks (tf32: the kernel now, and in session 18)": variant(**NOW, solve="one_launch"),
    "today, one launch by 32-row blocks (inverses from the 16-row ones, tf32: sessions 19-56)": variant(
        **NOW, solve="one_launch", block=32),
    "today, one launch by 32-row blocks, the 16-row inverses from 8-row ones too (tf32)": variant(
        **NOW, solve="one_launch", block=32, base=8),
}


def rms_ratio(ref, out):
    return float(np.sqrt(np.mean((ref - out) ** 2) / np.mean(ref ** 2)))


def compare(cases, variants, run):
    """{variant: (o's RMS ratio, the final state's)} of run(*case, variant's model) against the
    float64 recurrence over the cases (q, k, v, g, beta, h0, scale), pooled."""
    refs, outs = ([], []), {name: ([], []) for name in variants}
    for case in cases:
        for acc, x in zip(refs, reference(*case), strict=True):
            acc.append(x)
        for name, m in variants.items():
            for acc, x in zip(outs[name], run(*case, m), strict=True):
                acc.append(x)
    return {name: tuple(rms_ratio(np.array(r), np.array(x)) for r, x in zip(refs, out, strict=True))
            for name, out in outs.items()}


def study(tokens, dim, heads, l2norm, gmax, seed):
    """{variant: (o's RMS ratio, the final state's)} over `heads` heads of one sequence."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(heads):
        q, v = (bf16(rng.standard_normal((tokens, dim))) for _ in range(2))
        k = bf16(rng.standard_normal((tokens, dim)) * dim ** -0.5)
        g, beta = f32(-rng.random(tokens) * gmax), f32(rng.random(tokens))
        h0 = f32(rng.standard_normal((dim, dim)) * 0.1)
        if l2norm:
            q, k = (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6) for x in (q, k))
        cases.append((q, k, v, g, beta, h0, dim ** -0.5))
    return compare(cases, VARIANTS, chunked)


def kda_products(x, k, g2, tiles, r16):
    """sum_d x_i[d] k_j[d] 2^(G_i[d] - G_j[d]) (G: g2, log2 units) for the chunk's blocks j <= i's, from the
    prep's 16-bit operands: XS_i = x_i 2^(G_i - s_r) (s_r: G of block r's first row, c'_r = s_r - n_r
    from its row 7, n_r an integer); the diagonal block (XS 2^n_r, exact) . k_j 2^(c'_r - G_j); left of
    it, by `tiles`: "today" XS . k_j 2^(s_r - G_j) (a key tile per row block), "one" (XS 2^(s_r - c'_m))
    . k_j 2^(c'_m - G_j) (one 64-row tile, the diagonal's), "next" (XS 2^(s_r - s_{m+1})) . k_j 2^(s_{m+1} -
    G_j) (a 48-row tile beside the diagonal's; no factor for m = r - 1). Every factor <= 1 but the
    diagonal's."""
    n, out = len(x), np.zeros((len(x), len(x)))
    pad = np.concatenate([g2, np.repeat(g2[-1:], CHUNK + 16 - n, 0)])  # (rows past the end: G of the last)
    ref = [(pad[16 * r], pad[16 * r] - np.floor(pad[16 * r] - pad[16 * r + 7])) for r in range(CHUNK // 16)]
    for r in range((n + 15) // 16):
        ri, (s, cr) = slice(16 * r, 16 * r + 16), ref[r]
        xs = r16(x[ri] * np.exp2(g2[ri] - s))
        for m in range(r + 1):
            mj = slice(16 * m, 16 * m + 16)
            if m == r:
                left, right = xs * np.exp2(s - cr), r16(k[mj] * np.exp2(cr - g2[mj]))
            elif tiles == "today":
                left, right = xs, r16(k[mj] * np.exp2(s - g2[mj]))
            else:
                e = ref[m][1] if tiles == "one" else pad[16 * m + 16]
                left = xs if tiles == "next" and m == r - 1 else r16(xs * f32(np.exp2(s - e)))
                right = r16(k[mj] * np.exp2(e - g2[mj]))
            out[ri, mj] = f32(left @ right.T)
    return out


def kda_chunked(q, k, v, g, beta, h0, scale, tiles, r16, rhs="f32"):
    """KDA's chunked form (the prep's products and solve, the state kernel's chain); tiles=None:
    without roundings. rhs: the solve's right-hand side beta k exp(G) as the prep stores it ("f32"),
    in fp16 ("fp16"), or formed from the XS box, r16(k exp(G - s_r)) exp(s_r) ("xs")."""
    t16 = exact if tiles is None else bf16
    s, o = h0.copy(), np.zeros_like(v)
    for c0 in range(0, len(q), CHUNK):
        c1 = min(c0 + CHUNK, len(q))
        qc, kc, vc, bc = q[c0:c1], k[c0:c1], v[c0:c1], beta[c0:c1]
        g2 = f32(np.cumsum(g[c0:c1], 0) / np.log(2.0))
        if tiles is None:
            decay = np.exp2(g2[:, None, :] - g2[None, :, :])
            akk, aqk = (np.einsum("id,jd,ijd->ij", x, kc, decay) for x in (kc, qc))
        else:
            akk, aqk = (kda_products(x, kc, g2, tiles, r16) for x in (kc, qc))
        a, eg = np.tril(bc[:, None] * akk, -1), np.exp2(g2)
        xk, xv = f32(bc[:, None] * kc * eg), f32(bc[:, None] * vc)
        if rhs == "fp16":
            xk = fp16(xk)
        elif rhs == "xs":
            s_rows = g2[16 * (np.arange(len(g2)) // 16)]
            xk = f32(bc[:, None] * r16(kc * np.exp2(g2 - s_rows)) * np.exp2(s_rows))
        solve_r = exact if tiles is None else tf32
        w, u0 = t16(solve_blocks(a, xk, solve_r)), t16(solve_blocks(a, xv, solve_r))
        qg, kl, aqk = t16(scale * qc * eg), t16(kc * np.exp2(g2[-1] - g2)), t16(scale * np.tril(aqk))
        s16 = t16(s)
        u16 = t16(f32(u0 - w @ s16))
        o[c0:c1] = t16(qg @ s16 + aqk @ u16)
        s = np.exp2(g2[-1])[:, None] * s + kl.T @ u16
    return o, s


KDA_VARIANTS = {
    "no rounding": (None, exact),
    "the prep today (a key tile per row block: 40 KB at D = 128)": ("today", bf16),
    "one 64-row key tile, the diagonal's (16 KB)": ("one", bf16),
    "a 48-row key tile against the next block's first row, and the diagonal's (28 KB)": ("next", bf16),
    "today, the products' operands in fp16": ("today", fp16),
    "one 64-row key tile, operands in fp16": ("one", fp16),
    "one 64-row key tile, X's key half in fp16": ("one", bf16, "fp16"),
    "one 64-row key tile, X's key half from the 16-bit XS box": ("one", bf16, "xs"),
}


def kda_study(tokens, dim, heads, gmax, seed):
    """{variant: (o's RMS ratio, the final state's)}, l2norm, g per key in [-gmax, 0]."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(heads):
        q, v = (bf16(rng.standard_normal((tokens, dim))) for _ in range(2))
        k = bf16(rng.standard_normal((tokens, dim)))
        g, beta = f32(-rng.random((tokens, dim)) * gmax), f32(rng.random(tokens))
        h0 = f32(rng.standard_normal((dim, dim)) * 0.1)
        q, k = (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6) for x in (q, k))
        cases.append((q, k, v, g, beta, h0, dim ** -0.5))
    return compare(cases, KDA_VARIANTS,
                   lambda q, k, v, g, beta, h0, scale, m: kda_chunked(q, k, v, g, beta, h0, scale, *m))


def print_table(head, names, results):
    """The markdown table of results (one {variant: (o, state)} a column) for the variants `names`."""
    print("| " + " | ".join(["variant"] + head) + " |\n|" + "---|" * (len(head) + 1))
    for name in names:
        print("| " + " | ".join([name] + [f"{r[name][0]:.1e} / {r[name][1]:.1e}" for r in results]) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=2, help="heads per case (default 2)")
    parser.add_argument("--quick", action="store_true", help="one short case")
    parser.add_argument("--kda", action="store_true", help="KDA's per-key gate: the prep's products")
    opts = parser.parse_args()
    if opts.kda:
        cases = [(130, 64, 0.3)] if opts.quick else [(1000, 128, 0.3), (1000, 128, 1.0), (2100, 64, 0.3)]
        results = [kda_study(t, d, opts.heads, gmax, seed=t + d) for t, d, gmax in cases]
        print_table([f"T={t} D={d} l2norm g>=-{gmax} per key: o / state" for t, d, gmax in cases], KDA_VARIANTS,
                    results)
        return 0
    cases = [(256, 64, True, 0.3)] if opts.quick else [(1000, 128, True, 0.3), (1000, 128, False, 0.3),
                                                        (2100, 64, True, 0.3), (4096, 128, True, 0.02)]
    results = [study(t, d, opts.heads, l2, gmax, seed=t + d) for t, d, l2, gmax in cases]
    print_table([f"T={t} D={d}{' l2norm' if l2 else ''} g>=-{gmax}: o / state" for t, d, l2, gmax in cases], VARIANTS,
                results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
