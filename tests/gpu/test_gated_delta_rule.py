"""The gated delta rule (and simple_gla with a per-token gate) against the float64 token loop on a
real GPU: FLA's options, grouped value heads, varlen with empty and one-token sequences, states,
the serving decode on a state pool (one and several speculative tokens per sequence), vLLM's
keywords, CUDA-graph capture, and FLA 0.6.0 itself where it is installed. "chunk:1" runs the chunked
prefill in one launch, "chunk:2" in two (prep and state kernels; cula picks one of them by the
shape, CULA_GDN_CHUNK_LAUNCHES forces it here), "recurrent" the token loop. The one-launch kernel
and the two-launch state kernel have sm_90a variants (wgmma): "chunk:1:generic" and
"chunk:2:generic" force the others (CULA_FORCE_GENERIC), which the sm_100 family runs; the rest
has no architecture-specific code. "chunk:2:inverse" runs the two launches with the prep kernel that
forms W and U0 through the inverse of I + A (CULA_GDN_PREP=inverse). One long sequence on few
value heads runs in segments side by side (CULA_GDN_SPLIT forces it: test_split_*)."""

from __future__ import annotations

import json
import tempfile
import warnings
from functools import partial
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import cula  # noqa: E402
from cula._reference import gated_delta_rule_reference, rms_ratio  # noqa: E402
from test_ops_gpu import _gpu_work, cu_seqlens_of  # noqa: E402

TOL = 5e-3
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make(batch, total, heads, v_heads, dim, dtype=torch.bfloat16, seed=0, gate_in_kernel=False, nseq=None,
         with_state=True, scalar_dtype=torch.float32):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q = rnd(batch, total, heads, dim).to(dtype)
    k = (rnd(batch, total, heads, dim) * dim ** -0.5).to(dtype)  # |k| ~ 1: the update stays a contraction
    v = rnd(batch, total, v_heads, dim).to(dtype)
    if gate_in_kernel:
        g = rnd(batch, total, v_heads).to(scalar_dtype)  # raw gate input
    else:
        g = (-torch.rand(batch, total, v_heads, device="cuda", generator=gen) * 0.3).to(scalar_dtype)
    beta = torch.rand(batch, total, v_heads, device="cuda", generator=gen).to(scalar_dtype)
    h0 = rnd(nseq or batch, v_heads, dim, dim) * 0.1 if with_state else None
    extra = dict(A_log=torch.rand(v_heads, device="cuda", generator=gen) - 2.0,
                 dt_bias=rnd(v_heads) * 0.5) if gate_in_kernel else {}
    return q, k, v, g, beta, h0, extra


def check(ref, out, what):
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    err = rms_ratio(ref, out.double())
    assert err <= TOL, f"{what}: rms ratio {err:.2e} > {TOL}"
    return err


def run_op(op, q, k, v, g, beta, **kw):
    """op: "chunk:<launches>[:generic|:inverse]" or "recurrent"."""
    if op.startswith("chunk:"):
        _, launches, *how = op.split(":")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CULA_CHUNK_TOKEN_LOOP", "0")  # (the chunked kernels for short inputs too)
            mp.setenv("CULA_GDN_CHUNK_LAUNCHES", launches)
            mp.setenv("CULA_FORCE_GENERIC", "1" if how == ["generic"] else "0")
            mp.setenv("CULA_GDN_PREP", "inverse" if how == ["inverse"] else "solve")
            return cula.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    return cula.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kw)


OPS = ["chunk:1", "chunk:1:generic", "chunk:2", "chunk:2:generic", "chunk:2:inverse", "recurrent"]


CASES = [  # B, T, H, HV, D
    (1, 1, 2, 2, 64), (2, 63, 2, 4, 64), (2, 64, 1, 2, 128), (1, 65, 2, 2, 128), (2, 1000, 2, 4, 128),
    (1, 2100, 1, 2, 64),
]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}T{}H{}HV{}D{}".format(*c))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("l2norm", [False, True], ids=["raw", "l2norm"])
@pytest.mark.parametrize("gate", [False, True], ids=["g", "gate_in_kernel"])
def test_against_reference(op, case, dtype, l2norm, gate):
    batch, total, heads, v_heads, dim = case
    if total >= 1000 and (dtype == "fp16" or gate):
        pytest.skip("long sequences run once per option set")
    q, k, v, g, beta, h0, extra = make(batch, total, heads, v_heads, dim, DTYPES[dtype], hash(case) % 997, gate)
    o, ht = run_op(op, q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=l2norm,
                   use_gate_in_kernel=gate, **extra)
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, beta, None, h0, l2norm=l2norm, A_log=extra.get("A_log"),
                                              dt_bias=extra.get("dt_bias"))
    assert o.shape == v.shape and o.dtype == v.dtype and ht.shape == (batch, v_heads, dim, dim)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")


def check_varlen(op, lens, heads, v_heads, dim, seed=0):
    """op on packed sequences of these lengths (int32 cu_seqlens), with states, then without and
    with int64 cu_seqlens, against the float64 reference; an empty sequence's final state is its h0.
    Returns the inputs and the outputs with states."""
    cu = cu_seqlens_of(lens)
    q, k, v, g, beta, h0, _ = make(1, int(cu[-1]), heads, v_heads, dim, seed=seed, nseq=len(lens))
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    o, ht = run_op(op, q, k, v, g, beta, **kw)
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, beta, None, h0, cu_seqlens=cu.tolist(), l2norm=True)
    check(ref_o, o, "o")
    check(ref_h, ht, "final states")
    for n in (n for n, x in enumerate(lens) if x == 0):
        assert torch.equal(ht[n], h0[n]), f"sequence {n} is empty: its final state is its h0"
    o2, ht2 = run_op(op, q, k, v, g, beta, cu_seqlens=cu.long())
    ref_o2, _ = gated_delta_rule_reference(q, k, v, g, beta, cu_seqlens=cu.tolist())
    check(ref_o2, o2, "o without states")
    assert ht2 is None
    return (q, k, v, g, beta), kw, (o, ht)


@pytest.mark.parametrize("op", OPS)
def test_varlen_empty_and_short_sequences(op):
    check_varlen(op, [5, 0, 1, 64, 0, 130, 1], 2, 4, 128)


def serving_lengths(nseq, longest):
    """A serving prefill batch's sequence lengths: nseq random lengths up to `longest` (seeded by
    nseq), the first seven of them empty, 1-token and chunk-edge ones."""
    lens = torch.randint(0, longest + 1, (nseq,), generator=torch.Generator().manual_seed(nseq)).tolist()
    lens[:7] = [0, 1, 64, 65, 0, 128, 1]
    return lens


def check_token_loop_choice(family, limit, inputs, varlen, monkeypatch):
    """A chunk op whose longest sequence has at most `limit` tokens runs the token loop (the
    fused_recurrent op's kernel, and its bits) in one launch; one token more, the chunked kernels (the
    bits of CULA_CHUNK_TOKEN_LOOP=0). varlen: 3 sequences (one empty, more tokens in all than the
    longest), their longest read from cu_seqlens on the GPU ("varlen") or from cu_seqlens_cpu
    ("varlen_cpu"). CULA_CHUNK_TOKEN_LOOP=1 forces the token loop. inputs(batch, total, nseq):
    make()'s tuple."""
    chunk = getattr(cula, f"chunk_{family}")
    recurrent = getattr(cula, f"fused_recurrent_{family}")
    monkeypatch.delenv("CULA_CHUNK_TOKEN_LOOP", raising=False)

    def call(fn, longest):
        if varlen:
            lens = [longest - 1, 0, longest]
            cu = cu_seqlens_of(lens)
            q, k, v, g, beta, h0, kw = inputs(1, sum(lens), len(lens))
            if varlen == "varlen_cpu" and fn is chunk:
                kw = dict(kw, cu_seqlens_cpu=cu.cpu())
        else:
            cu = None
            q, k, v, g, beta, h0, kw = inputs(3, longest, None)
        return fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                  use_qk_l2norm_in_kernel=True, **kw)

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    short, long = call(chunk, limit), call(chunk, limit + 1)
    assert same(short, call(recurrent, limit)), f"{limit} tokens: the token loop's bits"
    kernels = lambda tokens: [n for n in _gpu_work(lambda: call(chunk, tokens)) if n.startswith("cula_")]  # noqa: E731
    assert len(kernels(limit)) == 1 and "_recurrent_" in kernels(limit)[0], f"{limit} tokens: one launch"
    assert not same(long, call(recurrent, limit + 1)), f"{limit + 1} tokens: not the token loop's bits"
    assert not any("_recurrent_" in name for name in kernels(limit + 1)), f"{limit + 1} tokens: chunked kernels"
    monkeypatch.setenv("CULA_CHUNK_TOKEN_LOOP", "0")
    assert same(long, call(chunk, limit + 1)), f"{limit + 1} tokens: the chunked kernels' bits"
    assert not same(short, call(chunk, limit)), "CULA_CHUNK_TOKEN_LOOP=0: the chunked kernels"
    monkeypatch.setenv("CULA_CHUNK_TOKEN_LOOP", "1")
    assert same(call(chunk, limit + 1), call(recurrent, limit + 1)), "CULA_CHUNK_TOKEN_LOOP=1: the token loop"


@pytest.mark.parametrize("varlen", [None, "varlen", "varlen_cpu"])
def test_short_inputs_run_the_token_loop(varlen, monkeypatch):
    """chunk_gated_delta_rule of sequences up to 6 tokens (native/src/gated_delta_rule_ops.cpp,
    chunk_as_token_loop)."""
    check_token_loop_choice("gated_delta_rule", 6, lambda b, t, nseq: make(b, t, 2, 4, 64, nseq=nseq, seed=t),
                            varlen, monkeypatch)


@pytest.mark.parametrize("op", ["chunk:1", "chunk:1:generic", "chunk:2"])
@pytest.mark.parametrize("nseq, heads, v_heads, dim, longest", [(90, 1, 2, 64, 200), (40, 2, 4, 128, 300),
                                                                (400, 4, 16, 128, 4)])
def test_many_short_sequences(op, nseq, heads, v_heads, dim, longest, monkeypatch):
    """A serving prefill batch of many short sequences: more (sequence, value head, value slice)
    items than SMs (180, 320 and 12800), random lengths with empty, 1-token and chunk-edge
    sequences. In one launch the CTAs walk several items each here (the _walk kernels:
    common/chunk_gated.cuh), and give the bits of a CTA an item (CULA_GDN_WALK=0)."""
    assert nseq * v_heads * dim // 64 > torch.cuda.get_device_properties(0).multi_processor_count
    lens = serving_lengths(nseq, longest)
    assert sum(lens) <= 8 * 64 * nseq, "short enough for the automatic choice to walk"
    inputs, kw, outs = check_varlen(op, lens, heads, v_heads, dim, seed=nseq)
    walks = lambda: any("_walk" in name for name in _gpu_work(lambda: run_op(op, *inputs, **kw)))  # noqa: E731
    assert walks() == op.startswith("chunk:1"), "the automatic choice: the _walk kernels, in one launch"
    monkeypatch.setenv("CULA_GDN_WALK", "0")
    assert not walks()
    for a, b in zip(run_op(op, *inputs, **kw), outs, strict=True):
        assert torch.equal(a, b), "a CTA an item computes the same bits"


def kernel_grids(fn):
    """(name, grid) of each kernel that one call of fn launches, from torch.profiler's trace (fn is
    called once before, unprofiled)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # (as test_ops_gpu._profiled)
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events", category=UserWarning)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
        trace = json.loads((Path(tmp) / "trace.json").read_text())
    return [(e["name"], tuple(e["args"]["grid"])) for e in trace["traceEvents"] if e.get("cat") == "kernel"]


def test_walk_in_whole_waves(monkeypatch):
    """More items than one wave of walking CTAs takes (CULA_WALK_ITEMS = 96 each, native/kernels/
    params.h): the walk runs in whole waves of CTAs, one a multiprocessor (chunk_one_launch: the CTAs
    of a part wave would start when the first wave ends, each with as many items), and gives the bits
    of a CTA an item. 2.5 waves' items at HV=4 D=128 (8 a sequence): 3 waves."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    nseq = 96 * sms * 5 // (2 * 8)
    cu = cu_seqlens_of(serving_lengths(nseq, 100))
    q, k, v, g, beta, h0, _ = make(1, int(cu[-1]), 1, 4, 128, seed=5, nseq=nseq)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    grids = [(n, grid) for n, grid in kernel_grids(lambda: run_op("chunk:1", q, k, v, g, beta, **kw))
             if n.startswith("cula_gdn_chunk")]
    assert len(grids) == 1 and "_walk" in grids[0][0], grids
    assert grids[0][1] == (3 * sms, 1, 1), f"three whole waves of {sms} CTAs: {grids}"
    walked = run_op("chunk:1", q, k, v, g, beta, **kw)
    monkeypatch.setenv("CULA_GDN_WALK", "0")
    for a, b in zip(run_op("chunk:1", q, k, v, g, beta, **kw), walked, strict=True):
        assert torch.equal(a, b), "a CTA an item computes the same bits"


@pytest.mark.parametrize("length, walks", [(8 * 64, True), (8 * 64 + 1, False), (16 * 64, False)])
def test_walk_threshold(length, walks):
    """The automatic choice walks (the _walk kernels) only where the sequences average 8 chunks or
    fewer (native/src/gated_delta_rule_ops.cpp, gdn_chunk_walk: longer items run faster a CTA
    each): 40 sequences of `length` tokens at HV=4 D=128 are 320 items, more than the SMs."""
    nseq = 40
    assert nseq * 4 * 2 > torch.cuda.get_device_properties(0).multi_processor_count
    cu = cu_seqlens_of([length] * nseq)
    q, k, v, g, beta, h0, _ = make(1, int(cu[-1]), 2, 4, 128, seed=length, nseq=nseq)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    names = [n for n in _gpu_work(lambda: run_op("chunk:1", q, k, v, g, beta, **kw)) if n.startswith("cula_gdn_chunk")]
    assert names, "a one-launch chunked kernel ran"
    assert all(("_walk" in n) == walks for n in names), names


@pytest.mark.parametrize("dim, share, sm90a, generic", [(128, 0.35, 2, 2), (128, 0.42, 1, 2), (128, 0.6, 1, 1),
                                                      (64, 0.18, 2, 2), (64, 0.3, 1, 1)])
def test_launch_choice(dim, share, sm90a, generic, monkeypatch):
    """One launch or two (two: cula asks for a workspace) by the share of the SMs the one-launch grid
    fills, per variant: the boundaries measured in notes/gated-delta-rule.md (session 21)."""
    from cula import _loader
    module = _loader.backend().module
    monkeypatch.delenv("CULA_GDN_CHUNK_LAUNCHES", raising=False)
    monkeypatch.delenv("CULA_FORCE_GENERIC", raising=False)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    seqs = round(share * sms * 64 / dim)  # one value head: dim / 64 CTAs a sequence

    def launches(variant, tokens):  # (sequences of equal length, read: no long one among them)
        each = tokens // seqs
        return 2 if module.chunk_workspace(per_key=False, delta=True, total_tokens=tokens, num_seqs=seqs, seq_len=0,
                                           longest=each, longest_at=0, v_heads=1, head_dim=dim, variant=variant,
                                           device=0, second=each) else 1

    assert (launches("sm90a", seqs * 8192), launches("generic", seqs * 8192)) == (sm90a, generic)
    assert launches("sm90a", seqs * 511) == 1, "sequences under 8 chunks on average: one launch"
    monkeypatch.setenv("CULA_FORCE_GENERIC", "1")
    assert launches("sm90a", seqs * 8192) == generic, "a forced generic device takes the generic kernels' rule"
    monkeypatch.setenv("CULA_GDN_CHUNK_LAUNCHES", "2")
    assert launches("sm90a", seqs * 511) == 2


SPLIT_CASES = [  # T, H, HV, D, segments, dtype, gate in the kernel
    (1000, 2, 4, 128, 3, "bf16", False), (2100, 1, 2, 64, 4, "fp16", True), (700, 2, 2, 128, 2, "bf16", True),
]


@pytest.mark.parametrize("variant", ["sm90a", "generic"])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: "T{}H{}HV{}D{}x{}{}{}".format(*c[:6], "gate" * c[6]))
def test_split_long_sequence(variant, case, monkeypatch):
    """One sequence in segments run side by side and joined (common/split.cuh; CULA_GDN_SPLIT=n: n
    segments of chunks // n chunks, the first taking the rest, here ending in a partial chunk):
    against the float64 reference with and without states, with value-first states bit for bit
    the key-first call, and in the split's kernels."""
    total, heads, v_heads, dim, segments, dtype, gate = case
    monkeypatch.setenv("CULA_FORCE_GENERIC", "1" if variant == "generic" else "0")
    q, k, v, g, beta, h0, extra = make(1, total, heads, v_heads, dim, DTYPES[dtype], seed=total, gate_in_kernel=gate)
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=gate, **extra)
    ref = lambda h: gated_delta_rule_reference(q, k, v, g, beta, None, h, l2norm=True, A_log=extra.get("A_log"),  # noqa: E731
                                               dt_bias=extra.get("dt_bias"))

    def call(split, **more):
        monkeypatch.setenv("CULA_GDN_SPLIT", str(split))
        return cula.chunk_gated_delta_rule(q, k, v, g, beta, **kw, **more)

    names = _gpu_work(lambda: call(segments, initial_state=h0, output_final_state=True))
    assert sum(n.startswith("cula_gdn_chunk_") for n in names) == 3 and \
        sum(n.startswith("cula_split_step") for n in names) == segments - 1 and \
        any(n.startswith("cula_split_fix_") for n in names), names
    o, ht = call(segments, initial_state=h0, output_final_state=True)
    ref_o, ref_h = ref(h0)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")
    o0, ht0 = call(segments)
    assert ht0 is None
    check(ref(None)[0], o0, "o from zero")
    ov, htv = call(segments, initial_state=h0.transpose(-1, -2).contiguous(), output_final_state=True,
                   state_v_first=True)
    assert torch.equal(ov, o) and torch.equal(htv.transpose(-1, -2), ht), "value-first states: the same bits"
    assert not any(n.startswith("cula_split") for n in _gpu_work(lambda: call(0, initial_state=h0))), \
        "CULA_GDN_SPLIT=0: not split"


def ran_split(fn) -> bool:
    """Whether fn's GPU work ran the split of one long sequence (its last kernel, split_fix)."""
    return any(n.startswith("cula_split_fix") for n in _gpu_work(fn))


def test_split_automatic(monkeypatch):
    """Unforced, one sequence of 64 chunks whose one-launch grid (4 CTAs) fills at most half the SMs
    runs in four segments of 16 chunks, bit for bit CULA_GDN_SPLIT=4; not with a forced launch
    count, and not two such sequences."""
    for name in ("CULA_GDN_SPLIT", "CULA_GDN_CHUNK_LAUNCHES", "CULA_FORCE_GENERIC", "CULA_CHUNK_TOKEN_LOOP"):
        monkeypatch.delenv(name, raising=False)
    q, k, v, g, beta, h0, _ = make(2, 4096, 1, 2, 128, seed=3)
    one = lambda: cula.chunk_gated_delta_rule(q[:1], k[:1], v[:1], g[:1], beta[:1], initial_state=h0[:1],  # noqa: E731
                                              output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert ran_split(one)
    auto = one()
    ref_o, ref_h = gated_delta_rule_reference(q[:1], k[:1], v[:1], g[:1], beta[:1], None, h0[:1], l2norm=True)
    check(ref_o, auto[0], "o")
    check(ref_h, auto[1], "final state")
    monkeypatch.setenv("CULA_GDN_SPLIT", "4")
    assert all(torch.equal(a, b) for a, b in zip(one(), auto, strict=True))
    monkeypatch.setenv("CULA_GDN_SPLIT", "2")
    assert not torch.equal(one()[0], auto[0]), "two segments: other bits"
    monkeypatch.delenv("CULA_GDN_SPLIT")
    assert not ran_split(lambda: cula.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0))
    monkeypatch.setenv("CULA_GDN_CHUNK_LAUNCHES", "1")
    assert not ran_split(one)


def test_split_one_varlen_sequence(monkeypatch):
    """A varlen call of one sequence (engines pass one long prompt so) is split as the fixed-length
    call is once the host has checked its cu_seqlens (on the device, or cu_seqlens_cpu): the same
    bits, SGLang's pool call too; with the values unchecked (CULA_CHECK_VALUES=0: the one sequence
    may end before T) it is not split."""
    for name in ("CULA_GDN_SPLIT", "CULA_GDN_CHUNK_LAUNCHES", "CULA_FORCE_GENERIC", "CULA_CHUNK_TOKEN_LOOP",
                 "CULA_CHECK_VALUES"):
        monkeypatch.delenv(name, raising=False)
    q, k, v, g, beta, h0, _ = make(1, 4096, 1, 2, 128, seed=5)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    cu = torch.tensor([0, 4096], dtype=torch.int32, device="cuda")
    fixed = lambda: cula.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, **kw)  # noqa: E731
    varlen = lambda **x: cula.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, **kw, **x)  # noqa: E731
    assert ran_split(fixed) and ran_split(varlen) and ran_split(lambda: varlen(cu_seqlens_cpu=cu.cpu()))
    o, ht = fixed()
    for name, (vo, vh) in (("device cu_seqlens", varlen()), ("cu_seqlens_cpu", varlen(cu_seqlens_cpu=cu.cpu()))):
        assert torch.equal(vo, o) and torch.equal(vh, ht), f"{name}: the fixed-length call's bits"
    pool = torch.randn(4, 2, 128, 128, device="cuda") * 0.1
    pool[2] = h0[0].transpose(-1, -2)
    slots = torch.tensor([2], dtype=torch.int64, device="cuda")
    pooled = lambda: cula.chunk_gated_delta_rule(  # noqa: E731
        q, k, v, g, beta, initial_state=pool, initial_state_indices=slots, state_v_first=True, cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True)
    assert ran_split(pooled)
    pool[2] = h0[0].transpose(-1, -2)
    po, _ = pooled()
    assert torch.equal(po, o) and torch.equal(pool[2].transpose(-1, -2), ht[0]), "the pool call's bits"
    monkeypatch.setenv("CULA_CHECK_VALUES", "0")
    assert not ran_split(varlen)
    uo, uh = varlen()
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, beta, None, h0, l2norm=True)
    check(ref_o, uo, "o (unchecked, unsplit)")
    check(ref_h, uh, "final state (unchecked, unsplit)")


@pytest.mark.parametrize("variant", ["sm90a", "generic"])
def test_split_long_among_short(variant, monkeypatch):
    """A varlen call whose checked cu_seqlens hold one long sequence beside short ones (96 chunks or
    more, at least twice the tokens of any other, none longer than its segments) runs the long one
    split, the others beside it: against the float64 reference; the long one's o and final state bit
    for bit its fixed-length call's, the others' those of a varlen call of them alone; with
    cu_seqlens_cpu, and through SGLang's value-first pool. Not split with the values unchecked, nor
    where another sequence is longer than a segment or has more than half its tokens."""
    for name in ("CULA_GDN_SPLIT", "CULA_GDN_CHUNK_LAUNCHES", "CULA_CHUNK_TOKEN_LOOP", "CULA_CHECK_VALUES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CULA_FORCE_GENERIC", "1" if variant == "generic" else "0")
    lengths, at = [1000, 0, 6400, 70, 1, 130], 2  # (6400: 6 segments of 16 chunks, the first taking 20)
    cu = cu_seqlens_of(lengths)
    bos, total = sum(lengths[:at]), sum(lengths)
    q, k, v, g, beta, _, extra = make(1, total, 1, 2, 128, seed=11, gate_in_kernel=True)
    h0 = torch.randn(len(lengths), 2, 128, 128, device="cuda") * 0.1
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, output_final_state=True, **extra)
    call = lambda **x: cula.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, **kw, **x)  # noqa: E731
    assert ran_split(call) and ran_split(lambda: call(cu_seqlens_cpu=cu.cpu()))
    o, ht = call()
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, beta, None, h0, cu, l2norm=True, **extra)
    check(ref_o, o, "o")
    check(ref_h, ht, "final states")
    rows = slice(bos, bos + lengths[at])
    lo, lh = cula.chunk_gated_delta_rule(*(x[:, rows] for x in (q, k, v, g, beta)), initial_state=h0[at:at + 1], **kw)
    assert torch.equal(o[:, rows], lo) and torch.equal(ht[at:at + 1], lh), "the long one: its own call's bits"
    others = [i for i in range(len(lengths)) if i != at]
    keep = torch.cat([torch.arange(sum(lengths[:i]), sum(lengths[:i + 1])) for i in others]).cuda()
    so, sh = cula.chunk_gated_delta_rule(*(x[:, keep] for x in (q, k, v, g, beta)), initial_state=h0[others],
                                         cu_seqlens=cu_seqlens_of([lengths[i] for i in others]), **kw)
    assert torch.equal(o[:, keep], so) and torch.equal(ht[others], sh), "the others: their own call's bits"
    assert all(torch.equal(a, b) for a, b in zip(call(cu_seqlens_cpu=cu.cpu()), (o, ht), strict=True))
    pool0 = torch.randn(9, 2, 128, 128, device="cuda") * 0.1
    slots = torch.tensor([4, 0, 7, 2, 8, 5], device="cuda")
    pool0[slots] = h0.transpose(-1, -2)
    pooled = lambda pool: cula.chunk_gated_delta_rule(  # noqa: E731
        q, k, v, g, beta, initial_state=pool, initial_state_indices=slots, state_v_first=True, cu_seqlens=cu,
        **{n: x for n, x in kw.items() if n != "output_final_state"})
    assert ran_split(lambda: pooled(pool0.clone()))
    pool = pool0.clone()
    po, _ = pooled(pool)
    torch.cuda.synchronize()
    assert torch.equal(po, o) and torch.equal(pool[slots].transpose(-1, -2), ht), "SGLang's pool: the same bits"
    monkeypatch.setenv("CULA_CHECK_VALUES", "0")
    assert not ran_split(call)
    check(ref_o, call()[0], "o, unchecked")
    monkeypatch.delenv("CULA_CHECK_VALUES")
    from cula import _loader
    module = _loader.backend().module
    size = lambda *read: module.chunk_workspace(  # noqa: E731
        per_key=False, delta=True, total_tokens=17920, num_seqs=4, seq_len=0, longest=read[0], longest_at=read[1],
        v_heads=8, head_dim=128, variant=variant, device=0, second=read[2])  # ([16384, 512, 512, 512]: one launch)
    assert size(0, -2, 0) == 0 < size(16384, 0, 512) <= size(0, -1, 0), \
        "the room kept for the lengths before they are read (none where they never are)"
    q, k, v, g, beta, _, extra = make(1, 9700, 1, 2, 128, seed=12, gate_in_kernel=True)
    kw.update(extra)
    # (segments of 16 chunks beside one other sequence: 1024 tokens; 2 x 3300 > 6400: not the long one)
    for two, split in (([1000, 6400], True), ([1100, 6400], False), ([6400, 3300], False)):
        args = [x[:, :sum(two)] for x in (q, k, v, g, beta)]
        assert ran_split(partial(cula.chunk_gated_delta_rule, *args, cu_seqlens=cu_seqlens_of(two), **kw)) == split, two


def test_beta_sigmoid_neg_eigval_and_scalar_dtypes():
    q, k, v, g, beta, h0, _ = make(2, 80, 2, 2, 64, scalar_dtype=torch.bfloat16)
    logits = (torch.randn_like(beta.float()) * 2).to(torch.float16)
    o, ht = cula.chunk_gated_delta_rule(q, k, v, g, logits, initial_state=h0, output_final_state=True, scale=0.3,
                                        use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                                        use_qk_l2norm_in_kernel=True)
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, logits, 0.3, h0, l2norm=True, beta_sigmoid=True,
                                              beta_scale=2.0)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("odd", [False, True])
def test_16bit_gates_at_either_half_of_a_word(op, odd):
    """16-bit g and beta (vLLM passes beta in bf16) at an even or an odd element offset, for every
    kernel; HV = 3 and T = 131: tokens at both halves of 4-byte words."""
    q, k, v, g, beta, h0, _ = make(1, 131, 1, 3, 64, scalar_dtype=torch.bfloat16)
    g, beta = (torch.cat([x.new_zeros(1), x.flatten()])[1:].view_as(x) if odd else x for x in (g, beta))
    assert (g.data_ptr() % 4 == 2) == odd and beta.dtype == torch.bfloat16
    o, ht = run_op(op, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, beta, None, h0)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")


def test_no_gate_no_beta():
    q, k, v, _, _, h0, _ = make(1, 100, 1, 1, 128)
    o, ht = cula.fused_recurrent_gated_delta_rule(q, k, v, initial_state=h0, output_final_state=True)
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, None, None, None, h0)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")


@pytest.mark.parametrize("op", OPS)
def test_nan_input_does_not_crash(op):
    """A NaN beta poisons its own (sequence, head) from its chunk on (the chunked kernel's products
    span the whole 64-token chunk), never another head or an earlier chunk."""
    q, k, v, g, beta, h0, _ = make(1, 140, 1, 2, 64)
    beta[0, 70, 1] = float("nan")
    o, ht = run_op(op, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    torch.cuda.synchronize()
    assert torch.isfinite(o[0, :64]).all() and torch.isfinite(o[0, :, 0]).all(), "NaN spread beyond its head"
    assert torch.isnan(o[0, 70:, 1]).any() and torch.isfinite(ht[0, 0]).all()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dim", [64, 128])
def test_strong_decay(op, dim):
    """Log decays down to -8 per token: a chunk's cumulative gate reaches about -250, far below what
    exp() of a factored form (exp(G_i) / exp(G_j)) survives in float32."""
    q, k, v, _, beta, h0, _ = make(2, 200, 2, 4, dim, seed=5)
    g = -torch.rand(2, 200, 4, device="cuda") * 8
    g[:, 100:110] = 0.0  # and a stretch without decay
    o, ht = run_op(op, q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, beta, None, h0, l2norm=True)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")


@pytest.mark.parametrize("variant", ["sm90a", "generic"])
@pytest.mark.parametrize("dim", [64, 128])
def test_simple_gla_per_token_strong_decay(dim, variant, monkeypatch):
    """chunk_simple_gla with a per-token g runs simple_gla's chunked kernels, whose decay factors come
    from the chunk's cumulative gates (in the generic kernel, what the sm_100 family runs, those left
    of a score tile's diagonal block as a product of two factors, each <= 1): the same strong decays
    as above, in both variants."""
    monkeypatch.setenv("CULA_FORCE_GENERIC", "1" if variant == "generic" else "0")
    q, k, v, _, _, h0, _ = make(2, 200, 2, 2, dim, seed=6)
    g = -torch.rand(2, 200, 2, device="cuda") * 8
    g[:, 100:110] = 0.0
    o, ht = cula.chunk_simple_gla(q, k, v, g=g, initial_state=h0, output_final_state=True)
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, None, None, h0, delta=False)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")


def pool_case(tokens):
    """The slots of 5 sequences in a pool of 16 (a padding sequence among them): [N] slots for one
    token, [N, S] slots and accepted-token counts for several; returns (idx, acc, src): src[i], the
    slot sequence i starts from."""
    if tokens == 1:
        idx = torch.tensor([3, -1, 7, 0, 12], device="cuda", dtype=torch.int32)
        return idx, None, idx.tolist()
    idx = torch.tensor([[1, 2, 3, 4], [-1, -1, -1, -1], [5, 6, 7, 8], [9, 10, 11, 13], [14, 15, 0, 12]],
                       device="cuda", dtype=torch.int64)
    acc = torch.tensor([1, 1, 3, 2, 4], device="cuda", dtype=torch.int32)
    return idx, acc, [idx[i, acc[i] - 1].item() for i in range(len(idx))]


def check_pool(o, pool, before, pool_slots, tokens, reference):
    """A decode step's o and pool against reference(i, start state) -> (o, states per token): a
    padding sequence's o is zero, each other writes one state per token, the other slots are as before."""
    idx, _, src = pool_slots
    written = set()
    for i in range(len(src)):
        if src[i] < 0:
            assert torch.equal(o[i], torch.zeros_like(o[i])), "a padding sequence's output is zero"
            continue
        ref_o, states = reference(i, before[src[i]][None])
        check(ref_o[0, 0] if tokens == 1 else ref_o[0], o[i], f"o of sequence {i}")
        slots = [src[i]] if tokens == 1 else idx[i, :tokens].tolist()
        for t, slot in enumerate(slots):
            check(states[t], pool[slot], f"state of sequence {i} after token {t}")
            written.add(slot)
    for slot in set(range(len(pool))) - written:
        assert torch.equal(pool[slot], before[slot]), f"slot {slot} was not to be written"


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("dim", [64, 128])
def test_decode_pool_in_place(tokens, dim):
    """One token per sequence ([N] slots) or T speculative tokens ([N, S] slots, num_accepted_tokens):
    each sequence starts from the accepted prefix's slot and writes one state per token."""
    n, heads, v_heads, pool_size = 5, 2, 4, 16
    q, k, v, g, beta, _, extra = make(n, tokens, heads, v_heads, dim, gate_in_kernel=True)
    pool = torch.randn(pool_size, v_heads, dim, dim, device="cuda") * 0.1
    slots = pool_case(tokens)
    before = pool.clone()
    qq, kk, vv, gg, bb = (x[:, 0] for x in (q, k, v, g, beta)) if tokens == 1 else (q, k, v, g, beta)
    out = torch.full_like(vv, float("nan"))
    o = cula.gated_delta_rule_decode(qq, kk, vv, gg, bb, pool, state_indices=slots[0], num_accepted_tokens=slots[1],
                                     use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                     use_beta_sigmoid_in_kernel=True, out=out, **extra)
    assert o is out

    def reference(i, h0):
        ref_o, _, states = gated_delta_rule_reference(q[i:i + 1], k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1],
                                                      None, h0, l2norm=True, beta_sigmoid=True, token_states=True,
                                                      **extra)
        return ref_o, states

    check_pool(o, pool, before, slots, tokens, reference)


def check_vllm_call(call, q, k, v, g, beta):
    """call(q, k, v, g, beta, pool, cu_seqlens, slots, accepted) -> (o, final_state): vLLM's serving
    call on 3 packed sequences of 3 tokens ([1, 9, ...] inputs), the pool, [N, S] slots and
    accepted-token counts, in place (l2norm on); checks o, the states per token and the untouched
    slot against the float64 loop and returns o."""
    n, s, v_heads, dim = 3, 3, v.shape[2], v.shape[3]
    pool = torch.randn(10, v_heads, dim, dim, device="cuda") * 0.1
    before = pool.clone()
    cu = torch.arange(0, n * s + 1, s, device="cuda", dtype=torch.int32)
    idx = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8]], device="cuda", dtype=torch.int32)
    acc = torch.tensor([2, 1, 3], device="cuda", dtype=torch.int32)
    o, final = call(q, k, v, g, beta, pool, cu, idx, acc)
    assert final is pool
    for i in range(n):
        sl = slice(i * s, (i + 1) * s)
        ref_o, _, states = gated_delta_rule_reference(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], None,
                                                      before[idx[i, acc[i] - 1]][None], l2norm=True,
                                                      token_states=True)
        check(ref_o[0], o[0, sl], f"o of sequence {i}")
        for t in range(s):
            check(states[t], pool[idx[i, t]], f"state of sequence {i} after token {t}")
    assert torch.equal(pool[9], before[9])
    return o


def test_vllm_call():
    """The call vLLM's Qwen3-Next layer makes (its FLA copy's signature): packed sequences, the pool,
    [N, S] slots and accepted-token counts, in place."""
    check_vllm_call(lambda q, k, v, g, beta, pool, cu, idx, acc: cula.fused_recurrent_gated_delta_rule(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, inplace_final_state=True, cu_seqlens=cu,
        ssm_state_indices=idx, num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True), *make(1, 9, 2, 4, 128)[:5])


def check_decode_in_cuda_graph(decode, make_step, v_heads, dim, **kw):
    """decode(q, k, v, g, beta, pool, ...) captured in a CUDA graph, replayed on new inputs
    (make_step(seed): the five inputs of 8 one-token sequences), equals the eager call."""
    n = 8
    bufs = [x.clone() for x in make_step(0)]
    pool = torch.randn(n + 2, v_heads, dim, dim, device="cuda") * 0.1
    idx = torch.randperm(n + 2, device="cuda")[:n].int()
    out = torch.empty_like(bufs[2])
    args = dict(state_indices=idx, use_qk_l2norm_in_kernel=True, check_indices=False, out=out, **kw)
    decode(*bufs, pool.clone(), **args)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph_pool = pool.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode(*bufs, graph_pool, **args)
    for buf, new in zip(bufs, make_step(7), strict=True):
        buf.copy_(new)
    graph_pool.copy_(pool)
    graph.replay()
    torch.cuda.synchronize()
    got, got_pool = out.clone(), graph_pool.clone()
    eager_pool = pool.clone()
    want = decode(*bufs, eager_pool, state_indices=idx, use_qk_l2norm_in_kernel=True, **kw)
    assert torch.equal(got, want) and torch.equal(got_pool, eager_pool)


def test_decode_in_cuda_graph():
    """A decode step captured in a CUDA graph, replayed on new inputs, equals the eager call."""
    check_decode_in_cuda_graph(cula.gated_delta_rule_decode,
                               lambda seed: (x[:, 0] for x in make(8, 1, 2, 4, 128, seed=seed)[:5]), 4, 128)


@pytest.mark.parametrize("op", ["chunk", "recurrent", "decode"])
def test_simple_gla_per_token_gate(op):
    """chunk/fused_recurrent_simple_gla and simple_gla_decode with g [.., H]: the gated recurrence
    without the delta rule; with g constant over time it equals the g_gamma kernels."""
    q, k, v, g, _, h0, _ = make(2, 1 if op == "decode" else 150, 2, 2, 128)
    if op == "decode":
        state = h0.clone()
        o = cula.simple_gla_decode(q[:, 0], k[:, 0], v[:, 0], state, g=g[:, 0])
        ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, None, None, h0, delta=False)
        check(ref_o[:, 0], o, "o")
        check(ref_h, state, "state")
        return
    fn = cula.chunk_simple_gla if op == "chunk" else cula.fused_recurrent_simple_gla
    o, ht = fn(q, k, v, g=g, initial_state=h0, output_final_state=True)
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, None, None, h0, delta=False)
    check(ref_o, o, "o")
    check(ref_h, ht, "final state")
    gamma = -torch.rand(2, device="cuda") * 0.2
    o1, h1 = fn(q, k, v, g=gamma.expand(2, 150, 2).contiguous(), initial_state=h0, output_final_state=True)
    o2, h2 = fn(q, k, v, g_gamma=gamma, initial_state=h0, output_final_state=True)
    check(o2.double(), o1, "per-token g == g_gamma")
    check(h2.double(), h1, "per-token g == g_gamma (state)")


def test_against_fla():
    """cula and FLA 0.6.0 on the same calls: cula within TOL of the float64 loop, and within 2 TOL of
    FLA (both round to 16 bits inside: their difference adds two approximations' errors)."""
    fla = pytest.importorskip("fla.ops.gated_delta_rule", reason="FLA 0.6.0 is the reference where installed")
    q, k, v, g, beta, h0, _ = make(2, 300, 2, 4, 128, seed=3)
    ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, beta, None, h0, l2norm=True)
    for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
        kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        if name.startswith("chunk"):
            want = getattr(fla, name)(q, k, v, g, beta, **kw)
            got = getattr(cula, name)(q, k, v, g, beta, **kw)
        else:
            want = getattr(fla, name)(q, k, v, g=g, beta=beta, **kw)
            got = getattr(cula, name)(q, k, v, g=g, beta=beta, **kw)
        for i, what in ((0, "o"), (1, "final state")):
            check((ref_o, ref_h)[i], got[i], f"{name}: cula's {what} against the float64 loop")
            err = rms_ratio(want[i].double(), got[i].double())
            assert err <= 2 * TOL, f"{name}: {what} against FLA: rms ratio {err:.2e} > {2 * TOL}"


def test_vllm_call_one_state_per_token():
    """inplace_final_state=False: the pool is only read (a strided one is copied first), and the state
    after every token comes back packed like v, [B*T, HV, K, V]."""
    n, s, heads, v_heads, dim = 2, 3, 1, 2, 64
    q, k, v, g, beta, _, _ = make(1, n * s, heads, v_heads, dim)
    wide = torch.randn(4, v_heads, dim, 2 * dim, device="cuda") * 0.1
    pool = wide[..., :dim]  # not contiguous
    before = pool.clone()
    cu = torch.tensor([0, s, 2 * s], device="cuda", dtype=torch.int32)
    idx = torch.tensor([[2, 0, 0], [1, 0, 0]], device="cuda", dtype=torch.int32)
    o, states = cula.fused_recurrent_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=pool,
                                                      inplace_final_state=False, cu_seqlens=cu,
                                                      ssm_state_indices=idx)
    assert states.shape == (n * s, v_heads, dim, dim) and torch.equal(pool, before)
    for i in range(n):
        sl = slice(i * s, (i + 1) * s)
        ref_o, _, ref_states = gated_delta_rule_reference(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], None,
                                                          before[idx[i, 0]][None], token_states=True)
        check(ref_o[0], o[0, sl], f"o of sequence {i}")
        check(ref_states, states[sl], f"states of sequence {i}")
