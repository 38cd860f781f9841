"""The kernels against the float64 reference on a real GPU (run by `make gpu-test`, once per
backend, each in its own venv). Both kernel variants run: the sm_90a specialisation and the
generic kernel (what the sm_100 family runs), forced with CULA_FORCE_GENERIC=1."""

from __future__ import annotations

import contextlib
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import cula  # noqa: E402
from cula._reference import gated_delta_rule_reference, rms_ratio, simple_gla_reference  # noqa: E402

TOL = 5e-3
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(params=["sm90a", "generic"])
def variant(request, monkeypatch):
    """sm90a: wgmma + TMA. generic: what the sm_100 family runs (mma.sync on the same TMA ring)."""
    cc = torch.cuda.get_device_capability()
    if request.param == "sm90a" and cc != (9, 0):
        pytest.skip(f"the sm_90a variant needs compute capability 9.0, this GPU has {cc}")
    if request.param == "generic":
        monkeypatch.setenv("CULA_FORCE_GENERIC", "1")
    else:
        monkeypatch.delenv("CULA_FORCE_GENERIC", raising=False)
    return request.param


def _inputs(batch, total, heads, dim, dtype, seed, with_state, nseq=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, total, heads, dim, device="cuda", generator=gen).to(dtype)
    k = (torch.randn(batch, total, heads, dim, device="cuda", generator=gen) * dim ** -0.5).to(dtype)
    v = torch.randn(batch, total, heads, dim, device="cuda", generator=gen).to(dtype)
    h0 = torch.randn(nseq or batch, heads, dim, dim, device="cuda", generator=gen) if with_state else None
    return q, k, v, h0


def _g_gamma(heads, kind):
    if kind == "none":
        return None
    if kind == "lightning":
        return torch.tensor(cula.lightning_attn_g_gamma(heads, 3, 12), device="cuda", dtype=torch.float32)
    return -torch.rand(heads, device="cuda") * 0.2 - 0.001


def _check(ref_o, ref_h, o, ht, what):
    assert not torch.isnan(o).any(), f"{what}: NaN in o"
    e_o = rms_ratio(ref_o, o.double())
    assert e_o <= TOL, f"{what}: rms(o) {e_o:.2e} > {TOL}"
    if ref_h is not None:
        e_h = rms_ratio(ref_h, ht.double())
        assert e_h <= TOL, f"{what}: rms(state) {e_h:.2e} > {TOL}"
    state = f" rms(state)={rms_ratio(ref_h, ht.double()):.1e}" if ref_h is not None else ""
    print(f"{what}: rms(o)={e_o:.1e}{state}")


SHAPES = [  # B, T, H, D
    (1, 1, 2, 64), (2, 63, 3, 64), (2, 64, 2, 128), (1, 65, 4, 128), (3, 200, 2, 64), (2, 1000, 2, 128),
    (1, 4099, 1, 128),
]


@pytest.mark.parametrize("op", ["chunk", "recurrent"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}D{}".format(*s))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("decay", ["none", "random", "lightning", "per_token"])
@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
def test_fixed_length(op, shape, dtype, decay, with_state, variant):
    """g_gamma (none, random, Lightning's) or a per-token g [B, T, H] (per_token: the chunked
    kernels' own per-token path, and the gated token loop; log decays from 0 to -2.2 a token, so
    that a whole chunk decays by about 2^(-100 +- 7), a partial one by less)."""
    batch, total, heads, dim = shape
    if op == "recurrent" and total > 1000 and decay != "random":
        pytest.skip("long token loops are covered once per dtype")
    q, k, v, h0 = _inputs(batch, total, heads, dim, DTYPES[dtype], hash((shape, dtype, decay)) % 1000, with_state)
    fn = cula.chunk_simple_gla if op == "chunk" else cula.fused_recurrent_simple_gla
    if decay == "per_token":
        g = -2.2 * torch.rand(batch, total, heads, device="cuda")
        ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, None, None, h0, delta=False)
        o, ht = fn(q, k, v, g=g, initial_state=h0, output_final_state=True)
    else:
        g = _g_gamma(heads, decay)
        ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, None, h0)
        o, ht = fn(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True)
    torch.cuda.synchronize()
    assert o.dtype == q.dtype and o.shape == v.shape and ht.dtype == torch.float32
    _check(ref_o, ref_h, o, ht, f"{op} {shape} {dtype} {decay} {variant}")


@pytest.mark.parametrize("op", ["chunk", "recurrent"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("dim", [64, 128])
def test_varlen(op, index_dtype, dim, variant):
    lengths = [1, 64, 0, 130, 63, 500, 7]
    cu = cu_seqlens_of(lengths, index_dtype)
    total, heads = int(cu[-1]), 3
    q, k, v, h0 = _inputs(1, total, heads, dim, torch.bfloat16, dim, True, nseq=len(lengths))
    g = _g_gamma(heads, "random")
    ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, 0.3, h0, cu_seqlens=cu.tolist())
    fn = cula.chunk_simple_gla if op == "chunk" else cula.fused_recurrent_simple_gla
    o, ht = fn(q, k, v, g_gamma=g, scale=0.3, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    torch.cuda.synchronize()
    _check(ref_o, ref_h, o, ht, f"varlen {op} D={dim} {index_dtype} {variant}")
    # The empty sequence's final state is its initial state.
    assert torch.equal(ht[2], h0[2])


def test_chunk_without_final_state_and_noncontiguous(variant):
    q, k, v, _ = _inputs(2, 300, 4, 128, torch.float16, 5, False)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, non-contiguous
    g = (-torch.rand(8, device="cuda") * 0.2)[::2]  # strided g_gamma
    assert not qt.is_contiguous() and not g.is_contiguous()
    o, ht = cula.chunk_simple_gla(qt, k, v, g_gamma=g)
    ref_o, _ = simple_gla_reference(torch, q, k, v, g)
    assert ht is None
    _check(ref_o, None, o, None, f"non-contiguous q and g_gamma {variant}")


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", ["NHK", "N1HK"])
def test_decode_pool(dim, dtype, layout, variant):
    n, heads, slots = 5, 4, 9
    gen = torch.Generator(device="cuda").manual_seed(dim)
    shape = (n, heads, dim) if layout == "NHK" else (n, 1, heads, dim)
    q, k, v = (torch.randn(shape, device="cuda", generator=gen).to(DTYPES[dtype]) for _ in range(3))
    pool = torch.randn(slots, heads, dim, dim, device="cuda", generator=gen)
    before = pool.clone()
    idx = torch.tensor([3, -1, 0, 8, 5], device="cuda", dtype=torch.int32)
    g = _g_gamma(heads, "random")
    o = cula.simple_gla_decode(q, k, v, pool, g_gamma=g, state_indices=idx)
    torch.cuda.synchronize()
    assert o.shape == v.shape
    for row, slot in enumerate(idx.tolist()):
        if slot < 0:
            assert torch.all(o[row] == 0), "padding slot must give zero output"
            continue
        q1, k1, v1 = (x[row].reshape(1, 1, heads, dim) for x in (q, k, v))
        ref_o, ref_h = simple_gla_reference(torch, q1, k1, v1, g, None, before[slot:slot + 1])
        _check(ref_o.reshape(o[row].shape), ref_h[0], o[row], pool[slot], f"decode slot {slot} {dtype} D={dim}")
    untouched = [s for s in range(slots) if s not in idx.tolist()]
    assert torch.equal(pool[untouched], before[untouched]), "slots without a sequence must not change"


@pytest.mark.parametrize("parts", [2, 3, 7, 64])
@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
def test_sequence_split(parts, with_state, variant, monkeypatch):
    """A sequence cut into pieces (states pass, then each piece from the earlier ones' states)
    gives the unsplit result; 64 asks for more pieces than the 17 chunks, so every chunk is one,
    the last a 3-token tail."""
    monkeypatch.setenv("CULA_SPLIT_PARTS", str(parts))
    q, k, v, h0 = _inputs(2, 1027, 3, 128, torch.bfloat16, 31, with_state)
    g = _g_gamma(3, "random")
    o, ht = cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True)
    ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, None, h0)
    _check(ref_o, ref_h, o, ht, f"split into {parts} pieces, {variant}")


@pytest.mark.parametrize("ctas", [1, 3, 8])
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("gate", ["g_gamma", "per_token", "per_token_bf16"])
def test_persistent_grid(ctas, dim, gate, variant, monkeypatch):
    """CULA_CHUNK_CTAS caps the prefill's grid, so that each CTA takes many work items in turn: its
    ring, state and o hand-overs, cleared rows past a partial last chunk and per-head decay tables
    (or, with a per-token gate g, the gates each stage of the ring carries) carry over between
    items of other heads, value slices and sequences, empty ones included. Two sequences after a
    partial one start with a NaN row, which the cleared rows must keep out of the partial one (and
    nothing may carry it into later items)."""
    monkeypatch.setenv("CULA_CHUNK_CTAS", str(ctas))
    lengths = [1, 64, 0, 130, 63, 500, 7, 192, 65, 40]
    poisoned = [4, 9]  # after the partial 130 and 65
    cu_list = [0]
    for n in lengths:
        cu_list.append(cu_list[-1] + n)
    heads = 3
    q, k, v, h0 = _inputs(1, cu_list[-1], heads, dim, torch.bfloat16, 7 + dim, True, nseq=len(lengths))
    for n in poisoned:
        for x in (q, k, v):
            x[0, cu_list[n]] = float("nan")
    cu = torch.tensor(cu_list, device="cuda", dtype=torch.int32)
    if gate == "g_gamma":
        g = _g_gamma(heads, "random")
        o, ht = cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, None, h0, cu_seqlens=cu_list)
    else:  # per-token log decays from 0 to -2, in float32 or bf16
        g = (-2 * torch.rand(1, cu_list[-1], heads, device="cuda")).to(
            torch.bfloat16 if gate == "per_token_bf16" else torch.float32)
        o, ht = cula.chunk_simple_gla(q, k, v, g=g, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        ref_o, ref_h = gated_delta_rule_reference(q, k, v, g, None, None, h0, cu_seqlens=cu_list, delta=False)
    torch.cuda.synchronize()
    clean = [n for n in range(len(lengths)) if n not in poisoned]
    tokens = torch.cat([torch.arange(cu_list[n], cu_list[n + 1]) for n in clean]).cuda()
    _check(ref_o[:, tokens], ref_h[clean], o[:, tokens], ht[clean], f"{ctas} CTAs, D={dim}, {gate}, {variant}")
    assert all(torch.isnan(o[0, cu_list[n]]).all() for n in poisoned), "the NaN rows must reach their own outputs"


def test_persistent_grid_split(variant, monkeypatch):
    """Split sequences (states pass, then the pieces) with fewer CTAs than pieces."""
    monkeypatch.setenv("CULA_CHUNK_CTAS", "2")
    monkeypatch.setenv("CULA_SPLIT_PARTS", "3")
    q, k, v, h0 = _inputs(2, 1000, 3, 128, torch.float16, 43, True)
    g = _g_gamma(3, "lightning")
    o, ht = cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True)
    ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, None, h0)
    _check(ref_o, ref_h, o, ht, f"split into 3 pieces on 2 CTAs, {variant}")


def test_one_varlen_sequence_as_fixed_length(monkeypatch):
    """A varlen call of one sequence whose cu_seqlens the host checks (on the device, or
    cu_seqlens_cpu) runs as the fixed-length call of B = 1: the same kernels, the split of the long
    sequence among them, and the same bits; with the values unchecked (CULA_CHECK_VALUES=0) the
    kernels read cu_seqlens, unsplit (the one sequence may end before T)."""
    monkeypatch.delenv("CULA_SPLIT_PARTS", raising=False)
    monkeypatch.delenv("CULA_CHECK_VALUES", raising=False)
    q, k, v, h0 = _inputs(1, 4096, 2, 128, torch.bfloat16, 47, True)
    g = _g_gamma(2, "random")
    cu = torch.tensor([0, 4096], device="cuda", dtype=torch.int32)
    calls = {"fixed": lambda: cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True),
             "varlen": lambda: cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True,
                                                     cu_seqlens=cu),
             "varlen, cu_seqlens_cpu": lambda: cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0,
                                                                     output_final_state=True, cu_seqlens=cu,
                                                                     cu_seqlens_cpu=cu.cpu())}
    kernels = {name: [n for n in _gpu_work(fn) if n.startswith("cula_")] for name, fn in calls.items()}
    assert any(n.endswith("_states") for n in kernels["fixed"]), f"B=1 H=2: split, got {kernels['fixed']}"
    o, ht = calls["fixed"]()
    for name in ("varlen", "varlen, cu_seqlens_cpu"):
        assert kernels[name] == kernels["fixed"], f"{name}: {kernels[name]}"
        vo, vh = calls[name]()
        assert torch.equal(vo, o) and torch.equal(vh, ht), f"{name}: the fixed-length call's bits"
    monkeypatch.setenv("CULA_CHECK_VALUES", "0")
    assert not any(n.endswith("_states") for n in _gpu_work(calls["varlen"])), "unchecked: not split"
    ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, None, h0)
    _check(ref_o, ref_h, *calls["varlen"](), "one varlen sequence, values unchecked")


def test_large_grid(variant):
    """More work items than SMs (each CTA takes two or more)."""
    q, k, v, h0 = _inputs(2, 200, 40, 128, torch.bfloat16, 41, True)
    g = _g_gamma(40, "random")
    o, ht = cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True)
    ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, None, h0)
    _check(ref_o, ref_h, o, ht, f"B=2 H=40, {variant}")


def test_decode_into_out_buffer():
    """out= receives o (the same object is returned) and gives what a fresh output gets."""
    heads, dim = 3, 128
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(4, heads, dim, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    pool = torch.randn(4, heads, dim, dim, device="cuda", generator=gen)
    pool2 = pool.clone()
    g = _g_gamma(heads, "random")
    expect = cula.simple_gla_decode(q, k, v, pool, g_gamma=g)
    out = torch.full_like(v, float("nan"))
    got = cula.simple_gla_decode(q, k, v, pool2, g_gamma=g, out=out)
    torch.cuda.synchronize()
    assert got is out
    assert torch.equal(out, expect) and torch.equal(pool2, pool)


def test_decode_matches_prefill_step_by_step(variant):
    """T decode steps from a prefilled state equal one prefill over all tokens (lightning decay)."""
    q, k, v, _ = _inputs(2, 70, 2, 64, torch.bfloat16, 11, False)
    o_full, h_full = cula.chunk_lightning_attn(q, k, v, layer_idx=1, num_layers=4, output_final_state=True)
    o_pre, state = cula.chunk_lightning_attn(q[:, :60], k[:, :60], v[:, :60], 1, 4, output_final_state=True)
    outs = [cula.lightning_attn_decode(q[:, t], k[:, t], v[:, t], state, 1, 4) for t in range(60, 70)]
    torch.cuda.synchronize()
    o_steps = torch.cat([o_pre, torch.stack(outs, dim=1)], dim=1)
    assert rms_ratio(o_full.double(), o_steps.double()) <= TOL
    assert rms_ratio(h_full.double(), state.double()) <= TOL


def cu_seqlens_of(lengths, dtype=torch.int32):
    """The cu_seqlens of packed sequences of these lengths, on the GPU."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=dtype)


def _gpu_work(fn):
    """The names of the GPU operations one call of fn queues, in the order they ran
    (torch.profiler; fn is called once before, unprofiled, so that set-up work is not counted)."""
    fn()
    torch.cuda.synchronize()
    with _profiled() as events:
        fn()
    return [e.name for e in sorted(events, key=lambda e: e.time_range.start)]


@contextlib.contextmanager
def _profiled():
    """torch.profiler around the block (synchronized at its end); the list given fills with the
    block's GPU events. (torch 2.11's profiler warns that it clears its events after each cycle: the
    one cycle here is all there is.)"""
    from torch.profiler import ProfilerActivity, profile
    events = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events", category=UserWarning)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            try:
                yield events
            finally:
                torch.cuda.synchronize()
        events += [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


# The calls of test_device_values_checked_right_before_the_launch (_values_on_device_calls)
VALUES_ON_DEVICE = ("chunk_simple_gla g_gamma", "chunk_simple_gla", "chunk_gated_delta_rule", "chunk_kda",
                    "fused_recurrent_kda", "simple_gla_decode", "gated_delta_rule_decode")


def _values_on_device_calls():
    """Calls whose values in device memory (cu_seqlens, pool indices) are checked on the host, each
    with a non-contiguous q (cula copies it first: GPU work of the op's own before its launch) and
    a way to spoil those values."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    lengths, heads, dim = [70, 0, 130, 1], 2, 64
    cu = cu_seqlens_of(lengths)
    total = int(cu[-1])
    q, k, v = (torch.randn(1, total, heads, dim, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    qt = torch.cat([q, q], dim=-1)[..., :dim]  # the same values, not contiguous
    k = k / dim ** 0.5
    g = -torch.rand(1, total, heads, device="cuda", generator=gen) * 0.1
    gk = -torch.rand(1, total, heads, dim, device="cuda", generator=gen) * 0.1
    beta = torch.rand(1, total, heads, device="cuda", generator=gen)
    h0 = torch.randn(len(lengths), heads, dim, dim, device="cuda", generator=gen)
    n, slots = 3, 5
    dq, dk, dv = (torch.randn(n, heads, dim, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    dqt = torch.cat([dq, dq], dim=-1)[..., :dim]
    pool = torch.randn(slots, heads, dim, dim, device="cuda", generator=gen)
    idx = torch.tensor([4, -1, 0], device="cuda", dtype=torch.int64)
    bad_cu = cu.clone()
    bad_cu[1] = 300  # (above cu[2])
    bad_idx = torch.tensor([4, 5, 0], device="cuda", dtype=torch.int64)
    seq = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu)
    gamma = -torch.rand(heads, device="cuda", generator=gen) * 0.1
    order, slots_range = "cu_seqlens must be non-decreasing", "state_indices must lie in"
    return {
        "chunk_simple_gla g_gamma": (lambda c: cula.chunk_simple_gla(qt, k, v, g_gamma=gamma,
                                                                     **dict(seq, cu_seqlens=c)),
                                     cu, bad_cu, order),
        "chunk_simple_gla": (lambda c: cula.chunk_simple_gla(qt, k, v, g=g, **dict(seq, cu_seqlens=c)),
                             cu, bad_cu, order),
        "chunk_gated_delta_rule": (lambda c: cula.chunk_gated_delta_rule(qt, k, v, g, beta, **dict(seq, cu_seqlens=c)),
                                   cu, bad_cu, order),
        "chunk_kda": (lambda c: cula.chunk_kda(qt, k, v, gk, beta, **dict(seq, cu_seqlens=c)), cu, bad_cu,
                      order),
        "fused_recurrent_kda": (lambda c: cula.fused_recurrent_kda(qt, k, v, gk, beta, **dict(seq, cu_seqlens=c)),
                                cu, bad_cu, order),
        "simple_gla_decode": (lambda i: cula.simple_gla_decode(dqt, dk, dv, pool, state_indices=i), idx, bad_idx,
                              slots_range),
        "gated_delta_rule_decode": (lambda i: cula.gated_delta_rule_decode(dqt, dk, dv, g[0, :n], beta[0, :n], pool,
                                                                           state_indices=i), idx, bad_idx,
                                    slots_range),
    }


@pytest.mark.parametrize("name", VALUES_ON_DEVICE)
def test_device_values_checked_right_before_the_launch(name):
    """The host copy of cu_seqlens or of the indices waits for the GPU, so it comes after all the
    op's other work: its copy of the non-contiguous q is queued before it, and nothing but cula's
    kernels after it. Spoilt values still raise the argument's error, and nothing is launched."""
    calls = _values_on_device_calls()
    assert set(calls) == set(VALUES_ON_DEVICE)
    fn, good, bad, message = calls[name]
    work = _gpu_work(lambda: fn(good))
    copies = [i for i, w in enumerate(work) if w.startswith("Memcpy DtoH")]
    assert len(copies) == 1, work
    before, after = work[:copies[0]], work[copies[0] + 1:]
    assert before and not any(w.startswith("cula_") for w in before), work  # (q's copy)
    assert after and all(w.startswith("cula_") for w in after), work
    with _profiled() as events, pytest.raises(ValueError, match=f"^cula: {message}"):
        fn(bad)
    launched = [e.name for e in events if e.name.startswith("cula_")]
    assert not launched, launched


def test_current_stream_and_graph_capture(variant):
    """Launches go on the caller's current stream: a CUDA graph captured on a side stream
    records the kernel (a launch on any other stream would break the capture)."""
    q, k, v, h0 = _inputs(2, 256, 2, 128, torch.bfloat16, 3, True)
    g = _g_gamma(2, "random")
    ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, None, h0)
    cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True)  # warm-up, loads module
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        o, ht = cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True)
    o.zero_()
    graph.replay()
    torch.cuda.synchronize()
    _check(ref_o, ref_h, o, ht, f"graph replay {variant}")


@pytest.mark.parametrize("op", ["chunk", "recurrent", "lightning"])
def test_varlen_unchecked(op, variant, monkeypatch):
    """cu_seqlens in device memory, values unchecked on the host: captured in a CUDA graph (no
    device-to-host copy may run there) the varlen call replays to the eager result bit for bit, and
    with CULA_CHECK_VALUES=0 values past the tokens are clamped to them (the same result as the
    true cu_seqlens), where the check would have refused them."""
    lengths = [5, 64, 0, 131]
    cu = cu_seqlens_of(lengths, torch.int32)
    total, heads = int(cu[-1]), 2
    q, k, v, h0 = _inputs(1, total, heads, 64, torch.bfloat16, 4, True, nseq=len(lengths))
    g = _g_gamma(heads, "random")
    if op == "lightning":
        def fn(cu_seqlens):
            return cula.chunk_lightning_attn(q, k, v, 3, 12, initial_state=h0, output_final_state=True,
                                             cu_seqlens=cu_seqlens)
    else:
        def fn(cu_seqlens):
            call = cula.chunk_simple_gla if op == "chunk" else cula.fused_recurrent_simple_gla
            return call(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
    want = fn(cu)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = fn(cu)
    got[0].zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1]), "graph replay"
    past = cu.clone()
    past[-1] += 40  # (the last sequence runs past the tokens)
    with pytest.raises(ValueError, match="cu_seqlens"):
        fn(past)
    monkeypatch.setenv("CULA_CHECK_VALUES", "0")
    clamped = fn(past)
    torch.cuda.synchronize()
    assert torch.equal(want[0], clamped[0]) and torch.equal(want[1], clamped[1]), "clamped cu_seqlens"


def test_cupy_inputs(variant):
    cupy = pytest.importorskip("cupy")
    q, k, v, h0 = _inputs(1, 130, 2, 64, torch.float16, 9, True)
    g = _g_gamma(2, "random")
    qc, kc, vc, hc, gc = (cupy.from_dlpack(x) for x in (q, k, v, h0, g))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        o, ht = cula.chunk_simple_gla(qc, kc, vc, g_gamma=gc, initial_state=hc, output_final_state=True)
    stream.synchronize()
    assert isinstance(o, cupy.ndarray) and isinstance(ht, cupy.ndarray)
    ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, None, h0)
    _check(ref_o, ref_h, torch.from_dlpack(o), torch.from_dlpack(ht), f"cupy {variant}")


def test_backend_and_runtime_reported():
    from cula import _loader
    b = _loader.backend()
    expected = os.environ.get("CULA_BACKEND")
    if expected:
        assert b.name == expected
    path = os.path.realpath(b.module.runtime_library_path())
    assert f"libcudart.so.{b.major}" in path
    with open("/proc/self/maps") as f:
        assert any(path in line for line in f), "the reported libcudart is not mapped in this process"
    print(f"backend cula-{b.name}: libcudart {path}, runtime {b.module.runtime_version()}")


def test_other_dlpack_library_jax():
    """Any CUDA array with __dlpack__ and the array API: here JAX. Outputs are JAX arrays."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU backend here")
    import numpy as np
    q, k, v, h0 = _inputs(1, 100, 2, 64, torch.bfloat16, 21, True)
    g = _g_gamma(2, "random")
    qj, kj, vj, hj, gj = (jax.numpy.asarray(np.asarray(x.float().cpu())) for x in (q, k, v, h0, g))
    qj, kj, vj = (x.astype(jax.numpy.bfloat16) for x in (qj, kj, vj))
    o, ht = cula.chunk_simple_gla(qj, kj, vj, g_gamma=gj, initial_state=hj, output_final_state=True)
    assert isinstance(o, jax.Array) and o.dtype == jax.numpy.bfloat16 and ht.shape == (1, 2, 64, 64)
    ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, None, h0)
    o_t = torch.from_numpy(np.array(o.astype(jax.numpy.float32))).cuda()
    h_t = torch.from_numpy(np.array(ht)).cuda()
    _check(ref_o, ref_h, o_t, h_t, "jax arrays")


def test_unsupported_gpu_is_a_clear_error(monkeypatch):
    """A GPU the fat binary has no code for (simulated by dropping CC 9.0 from the table)."""
    from cula import _loader, _probe
    b = _loader.backend()
    monkeypatch.setattr(_probe, "SUPPORTED_CC", {(10, 0): "sm_100f", (10, 3): "sm_100f"})
    monkeypatch.setattr(b, "checked_devices", {})
    q, k, v, _ = _inputs(1, 8, 1, 64, torch.bfloat16, 1, False)
    with pytest.raises(cula.BackendError, match=r"compute capability 9\.0 \(sm_90\), which this build of cula does "
                                                r"not support\. Supported: sm_90 .*fat binary targets: sm_90a, "
                                                r"sm_100f\)"):
        cula.chunk_simple_gla(q, k, v)


def test_driver_too_old_is_a_clear_error():
    """A backend newer than the driver (simulated: a cu14 backend on this CUDA 13 driver)."""
    import dataclasses

    from cula import _loader
    b = dataclasses.replace(_loader.backend(), name="cu14", checked_devices={})
    driver = b.module.driver_version()
    with pytest.raises(cula.BackendError, match=rf"the driver supports CUDA {driver // 1000}\.{driver % 1000 // 10}, "
                                                r"but cula-cu14 needs CUDA 14\.0 or newer: update the NVIDIA driver"):
        _loader.check_device(b, 0)
