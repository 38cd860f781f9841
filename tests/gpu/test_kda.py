"""KDA (Kimi Delta Attention: the gated delta rule with a per-key gate) against the float64 token
loop on a real GPU: FLA's gate options (g as given, the in-kernel softplus gate, the lower-bound
gate with and without A_log), grouped value heads, varlen with empty and one-token sequences,
states, the serving decode on a state pool (one and several speculative tokens per sequence),
vLLM's keywords and out=, CUDA-graph capture, and FLA 0.6.0 itself where it is installed.
"chunk" runs chunk_kda's kernels (common/chunk_kda.cuh), with the sm_90a variant of the state
kernel (its chain by wgmma) where the GPU has it, "chunk:generic" with the variant the sm_100
family runs (CULA_FORCE_GENERIC); "recurrent" the token loop, which has no architecture-specific
code. Gates so steep that the prep kernel's diagonal blocks take their element-wise path are
tested apart."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import cula  # noqa: E402
from cula._reference import gated_delta_rule_reference, rms_ratio  # noqa: E402
from test_gated_delta_rule import (  # noqa: E402
    CASES,
    DTYPES,
    TOL,
    check,
    check_decode_in_cuda_graph,
    check_pool,
    check_token_loop_choice,
    check_vllm_call,
    pool_case,
    serving_lengths,
)
from test_gated_delta_rule import make as make_gdn  # noqa: E402
from test_ops_gpu import _profiled, cu_seqlens_of  # noqa: E402

GATES = ["g", "softplus", "lower_bound", "lower_bound_no_A_log"]


def make(batch, total, heads, v_heads, dim, dtype=torch.bfloat16, seed=0, gate="g", nseq=None, with_state=True,
         scalar_dtype=torch.float32):
    """Inputs and the gate's keywords (for the op and, with gate_in_kernel, the reference)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q = rnd(batch, total, heads, dim).to(dtype)
    k = (rnd(batch, total, heads, dim) * dim ** -0.5).to(dtype)
    v = rnd(batch, total, v_heads, dim).to(dtype)
    if gate == "g":
        g = (-torch.rand(batch, total, v_heads, dim, device="cuda", generator=gen) * 0.3).to(scalar_dtype)
        kw = {}
    else:
        g = rnd(batch, total, v_heads, dim).to(scalar_dtype)  # the raw gate input
        kw = dict(use_gate_in_kernel=True, dt_bias=rnd(v_heads * dim) * 0.5)
        if gate != "lower_bound_no_A_log":
            kw["A_log"] = torch.rand(v_heads, device="cuda", generator=gen) - 2.0
        if gate.startswith("lower_bound"):
            kw["lower_bound"] = -5.0
    beta = torch.rand(batch, total, v_heads, device="cuda", generator=gen).to(scalar_dtype)
    h0 = rnd(nseq or batch, v_heads, dim, dim) * 0.1 if with_state else None
    return q, k, v, g, beta, h0, kw


def reference(q, k, v, g, beta, h0, kw, **extra):
    ref_kw = {name: kw[name] for name in ("A_log", "dt_bias", "lower_bound") if name in kw}
    return gated_delta_rule_reference(q, k, v, g, beta, extra.pop("scale", None), h0,
                                      gate_in_kernel=kw.get("use_gate_in_kernel", False), **ref_kw, **extra)


def run_op(op, q, k, v, g, beta, **kw):
    if op == "recurrent":
        return cula.fused_recurrent_kda(q, k, v, g, beta, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CULA_CHUNK_TOKEN_LOOP", "0")  # (the chunked kernels for short inputs too)
        mp.setenv("CULA_FORCE_GENERIC", "1" if op == "chunk:generic" else "0")
        return cula.chunk_kda(q, k, v, g, beta, **kw)


OPS = ["chunk", "chunk:generic", "recurrent"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}T{}H{}HV{}D{}".format(*c))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("l2norm", [False, True], ids=["raw", "l2norm"])
@pytest.mark.parametrize("gate", GATES)
def test_against_reference(op, case, dtype, l2norm, gate):
    b, t, h, hv, d = case
    q, k, v, g, beta, h0, kw = make(b, t, h, hv, d, DTYPES[dtype], seed=t + d, gate=gate)
    o, ht = run_op(op, q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=l2norm,
                   **kw)
    ref_o, ref_h = reference(q, k, v, g, beta, h0, kw, l2norm=l2norm)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")


@pytest.mark.parametrize("op", OPS)
def test_varlen_empty_and_short_sequences(op):
    lens = [0, 1, 130, 0, 64, 7]
    cu = cu_seqlens_of(lens)
    q, k, v, g, beta, h0, kw = make(1, sum(lens), 2, 4, 128, nseq=len(lens), gate="lower_bound")
    o, ht = run_op(op, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                   use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, **kw)
    ref_o, ref_h = reference(q, k, v, g, beta, h0, kw, cu_seqlens=cu.tolist(), l2norm=True, beta_sigmoid=True,
                             beta_scale=2.0)
    check(ref_o, o, "o")
    check(ref_h, ht, "final states")
    assert torch.equal(ht[0], h0[0]) and torch.equal(ht[3], h0[3]), "an empty sequence keeps its state"


@pytest.mark.parametrize("op", ["chunk", "chunk:generic"])
@pytest.mark.parametrize("nseq, heads, v_heads, dim, longest", [(90, 1, 2, 64, 200), (40, 2, 4, 128, 300),
                                                                (5, 2, 16, 128, None)])
def test_many_sequences(op, nseq, heads, v_heads, dim, longest):
    """More (sequence, value head, value slice) items than SMs (180, 320, 160: the state kernel in
    several waves): a serving prefill batch of random lengths with empty, 1-token and chunk-edge
    sequences, and a fixed-length batch (longest None: 5 x 130 tokens)."""
    assert nseq * v_heads * dim // 64 > torch.cuda.get_device_properties(0).multi_processor_count
    if longest is None:
        lens, cu, batch = [130] * nseq, None, nseq
    else:
        lens = serving_lengths(nseq, longest)
        cu = cu_seqlens_of(lens)
        batch = 1
    q, k, v, g, beta, h0, kw = make(batch, sum(lens) // batch, heads, v_heads, dim, nseq=nseq, seed=nseq,
                                    gate="lower_bound")
    o, ht = run_op(op, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                   use_qk_l2norm_in_kernel=True, **kw)
    ref_o, ref_h = reference(q, k, v, g, beta, h0, kw, cu_seqlens=None if cu is None else cu.tolist(), l2norm=True)
    check(ref_o, o, "o")
    check(ref_h, ht, "final states")
    for n in (i for i, length in enumerate(lens) if length == 0):
        assert torch.equal(ht[n], h0[n]), "an empty sequence keeps its state"


@pytest.mark.parametrize("variant", ["sm90a", "generic"])
@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_state_kernel_starts_early(family, variant, monkeypatch):
    """The two launches' state kernel is launched early on the prep (programmatic dependent launch,
    native/src/runtime.h): with SMs left free by the prep, its CTAs start before the prep has ended
    and wait there for the workspace (drivers of CUDA 12.3 on); with CULA_PDL=0 it starts after. The
    bits are the same either way, and the float64 reference's, for KDA and for the gated delta rule's
    two launches."""
    monkeypatch.setenv("CULA_FORCE_GENERIC", "1" if variant == "generic" else "0")
    monkeypatch.setenv("CULA_CHUNK_TOKEN_LOOP", "0")
    if family == "kda":  # (B=1 T=1024 H=2: a prep CTA a chunk, 32 of them, and 4 state CTAs)
        q, k, v, g, beta, h0, kw = make(1, 1024, 2, 2, 128, seed=5, gate="lower_bound")
        call = lambda: cula.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,  # noqa: E731
                                      use_qk_l2norm_in_kernel=True, **kw)
        ref_o, ref_h = reference(q, k, v, g, beta, h0, kw, l2norm=True)
    else:
        monkeypatch.setenv("CULA_GDN_CHUNK_LAUNCHES", "2")
        monkeypatch.setenv("CULA_GDN_SPLIT", "0")
        q, k, v, g, beta, h0, _ = make_gdn(1, 1024, 1, 2, 128, seed=5)
        call = lambda: cula.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,  # noqa: E731
                                                   output_final_state=True, use_qk_l2norm_in_kernel=True)
        ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, beta, None, h0, l2norm=True)

    def timeline():
        call()
        torch.cuda.synchronize()
        with _profiled() as events:
            torch.cuda._sleep(2_000_000)  # (both launches queued before the prep starts)
            outs = call()
        span = {e.name.split("_")[3]: e.time_range for e in events if e.name.startswith("cula_")}
        assert set(span) == {"prep", "state"}, sorted(span)
        return outs, span["state"].start < span["prep"].end

    from cula import _loader
    able = _loader.backend().module.driver_version() >= 12030  # (runtime.h: else an ordinary launch)
    (o, ht), early = timeline()
    assert early == able, "the state kernel started before the prep ended (where the driver launches so)"
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")
    monkeypatch.setenv("CULA_PDL", "0")
    (o0, ht0), early = timeline()
    assert not early, "CULA_PDL=0: the state kernel started after the prep"
    assert torch.equal(o, o0) and torch.equal(ht, ht0), "the same bits"


@pytest.mark.parametrize("varlen", [None, "varlen", "varlen_cpu"])
def test_short_inputs_run_the_token_loop(varlen, monkeypatch):
    """chunk_kda of sequences up to 12 tokens: one launch of the token loop in place of the chunked
    kernels' two (native/src/gated_delta_rule_ops.cpp, chunk_as_token_loop)."""
    check_token_loop_choice("kda", 12, lambda b, t, nseq: make(b, t, 2, 4, 128, nseq=nseq, seed=t,
                                                                gate="lower_bound"), varlen, monkeypatch)


def test_scalar_dtypes_and_no_state():
    q, k, v, g, beta, _, kw = make(2, 100, 2, 2, 64, gate="softplus", with_state=False,
                                   scalar_dtype=torch.bfloat16)
    kw["dt_bias"] = kw["dt_bias"].half().view(2, 64)
    o, ht = cula.chunk_kda(q, k, v, g, beta, output_final_state=True, scale=0.5, **kw)
    ref_o, ref_h = reference(q, k, v, g, beta, None, kw, scale=0.5)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mix", ["all", "some_heads", "some_blocks"])
def test_chunk_steep_gates(dtype, mix):
    """Gates down to -20 a token: the chunked kernel's diagonal blocks whose decay spans more than
    their 16-bit operands hold are computed element by element (bf16: a span past 2^96 in half a
    block; fp16: past 2^8), the others by mma, in the same launch."""
    q, k, v, g, beta, h0, kw = make(2, 200, 2, 4, 128, DTYPES[dtype], seed=7)
    steep = -torch.rand(g.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3)) * 20
    if mix == "all":
        g = steep
    elif mix == "some_heads":
        g[:, :, 1::2] = steep[:, :, 1::2]
    else:
        g[:, 64:80] = steep[:, 64:80]
        g[:, 150:151] = steep[:, 150:151]
    o, ht = cula.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    ref_o, ref_h = reference(q, k, v, g, beta, h0, kw, l2norm=True)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")


@pytest.mark.parametrize("op", OPS)
def test_nan_input_does_not_crash(op):
    """A NaN gate spreads to the tokens after it (and, in the chunked kernels, to the rest of its
    64-token chunk: the sm_90a state kernel multiplies whole chunks, zeros by NaN included), never
    to an earlier chunk or another head, and nothing crashes."""
    q, k, v, g, beta, h0, _ = make(1, 140, 1, 2, 64)
    g[0, 70, 1, 3] = float("nan")
    o, ht = run_op(op, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    torch.cuda.synchronize()
    assert torch.isfinite(o[0, :64]).all() and torch.isfinite(o[0, :, 0]).all(), "NaN spread beyond its head"
    assert not torch.isfinite(o[0, 70:, 1]).all() and torch.isfinite(ht[0, 0]).all()


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("dim", [64, 128])
def test_decode_pool_in_place(tokens, dim):
    """One token per sequence ([N] slots) or T speculative tokens ([N, S] slots, num_accepted_tokens):
    each sequence starts from the accepted prefix's slot and writes one state per token."""
    n, heads, v_heads, pool_size = 5, 2, 4, 16
    q, k, v, g, beta, _, kw = make(n, tokens, heads, v_heads, dim, gate="lower_bound")
    pool = torch.randn(pool_size, v_heads, dim, dim, device="cuda") * 0.1
    slots = pool_case(tokens)
    before = pool.clone()
    qq, kk, vv, gg, bb = (x[:, 0] for x in (q, k, v, g, beta)) if tokens == 1 else (q, k, v, g, beta)
    out = torch.full_like(vv, float("nan"))
    o = cula.kda_decode(qq, kk, vv, gg, bb, pool, state_indices=slots[0], num_accepted_tokens=slots[1],
                        use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, out=out, **kw)
    assert o is out

    def ref(i, h0):
        ref_o, _, states = reference(q[i:i + 1], k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1], h0, kw,
                                     l2norm=True, beta_sigmoid=True, token_states=True)
        return ref_o, states

    check_pool(o, pool, before, slots, tokens, ref)


def test_vllm_call():
    """The call vLLM's Kimi Linear layer makes (its FLA copy's keywords): packed sequences, the pool,
    [N, S] slots and accepted-token counts, in place; o into out=."""
    q, k, v, g, beta, _, _ = make(1, 9, 2, 2, 128)
    out = torch.empty_like(v)
    o = check_vllm_call(lambda q, k, v, g, beta, pool, cu, idx, acc: cula.fused_recurrent_kda(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
        ssm_state_indices=idx, num_accepted_tokens=acc, out=out), q, k, v, g, beta)
    assert o is out


def test_decode_in_cuda_graph():
    """A decode step captured in a CUDA graph, replayed on new inputs, equals the eager call."""
    kw = make(8, 1, 2, 4, 128, gate="softplus")[-1]
    check_decode_in_cuda_graph(cula.kda_decode,
                               lambda seed: (x[:, 0] for x in make(8, 1, 2, 4, 128, seed=seed, gate="softplus")[:5]),
                               4, 128, **kw)


@pytest.mark.parametrize("gate", ["g", "softplus", "lower_bound"])
def test_against_fla(gate):
    """cula and FLA 0.6.0 on the same calls (chunk_kda with safe_gate where the gate is bounded):
    cula within TOL of the float64 loop, and within 2 TOL of FLA."""
    fla = pytest.importorskip("fla.ops.kda", reason="FLA 0.6.0 is the reference where installed")
    q, k, v, g, beta, h0, kw = make(2, 300, 2, 4, 128, seed=3, gate=gate)
    ref_o, ref_h = reference(q, k, v, g, beta, h0, kw, l2norm=True)
    for name in ("chunk_kda", "fused_recurrent_kda"):
        args = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True, **kw)
        if name == "chunk_kda" and gate == "lower_bound":
            args["safe_gate"] = True
        want = getattr(fla, name)(q, k, v, g, beta, **args)
        got = getattr(cula, name)(q, k, v, g, beta, **args)
        for i, what in ((0, "o"), (1, "final state")):
            check((ref_o, ref_h)[i], got[i], f"{name}: cula's {what} against the float64 loop")
            err = rms_ratio(want[i].double(), got[i].double())
            assert err <= 2 * TOL, f"{name}: {what} against FLA: rms ratio {err:.2e} > {2 * TOL}"
