"""simple_gla's fast path for torch tensors (native/src/simple_gla_fastpath.cpp on fastpath.cpp)
against the Python path (cula/_checks.py): it gives bit-identical results where it runs, it is what
plain calls take, and for every input the Python path rejects, copies or converts it answers None,
so the Python path raises the error that names the argument."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import cula  # noqa: E402
from cula import lightning_attn  # noqa: E402

N, H, D, P = 4, 2, 64, 6


def _decode_args(layout="NHK", dtype=torch.bfloat16, dim=D):
    gen = torch.Generator(device="cuda").manual_seed(7)
    shape = (N, H, dim) if layout == "NHK" else (N, 1, H, dim)
    q, k, v = (torch.randn(shape, device="cuda", generator=gen).to(dtype) for _ in range(3))
    pool = torch.randn(P, H, dim, dim, device="cuda", generator=gen)
    g = -torch.rand(H, device="cuda", generator=gen) * 0.2
    idx = torch.tensor([3, -1, 0, 5], device="cuda", dtype=torch.int32)
    return dict(q=q, k=k, v=v, state=pool, g_gamma=g, scale=None, state_indices=idx, check_indices=False, out=None)


def _fast_decode(fast, a):
    return fast.decode(a["q"], a["k"], a["v"], a["state"], a["g_gamma"], a["scale"], a["state_indices"],
                             a["check_indices"], a["out"])


@pytest.mark.parametrize("case", ["indices", "no indices", "N1HK", "fp16 D128", "out", "no decay", "int scale",
                                  "int64 indices"])
def test_decode_fast_equals_python(case, fast, python_path):
    a = _decode_args("N1HK" if case == "N1HK" else "NHK", *((torch.float16, 128) if case == "fp16 D128" else ()))
    if case == "no indices":
        a["state_indices"], a["state"] = None, a["state"][:N].clone()
    if case == "out":
        a["out"] = torch.full_like(a["v"], float("nan"))
    if case == "no decay":
        a["g_gamma"] = None
    if case == "int scale":
        a["scale"] = 1
    if case == "int64 indices":
        a["state_indices"] = a["state_indices"].long()
    b = dict(a, state=a["state"].clone(), out=None if a["out"] is None else a["out"].clone())
    o_fast = _fast_decode(fast, a)
    assert o_fast is not None, f"{case}: the fast path declined a plain call"
    if a["out"] is not None:
        assert o_fast is a["out"]
    o_py = python_path(cula.simple_gla_decode, **b)
    torch.cuda.synchronize()
    assert torch.equal(o_fast, o_py) and torch.equal(a["state"], b["state"]), case


def _seq_args(batch=2, total=130, heads=H, dim=D, with_state=True):
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(batch, total, heads, dim, device="cuda", generator=gen).to(torch.bfloat16) * 0.3
               for _ in range(3))
    h0 = torch.randn(batch, heads, dim, dim, device="cuda", generator=gen) if with_state else None
    g = -torch.rand(heads, device="cuda", generator=gen) * 0.2
    return dict(q=q, k=k, v=v, g_gamma=g, scale=None, initial_state=h0, output_final_state=True)


def _fast_seq(fast, recurrent, a):
    return fast.sequence(recurrent, a["q"], a["k"], a["v"], a["g_gamma"], a["scale"], a["initial_state"],
                               a["output_final_state"])


@pytest.mark.parametrize("op", ["chunk", "recurrent"])
@pytest.mark.parametrize("case", ["state", "no state", "no final state", "split", "generic", "D128 float scale"])
def test_sequence_fast_equals_python(op, case, fast, python_path, monkeypatch):
    a = _seq_args(dim=128 if case == "D128 float scale" else D, with_state=case != "no state")
    if case == "no final state":
        a["output_final_state"] = False
    if case == "split":
        monkeypatch.setenv("CULA_SPLIT_PARTS", "3")
    if case == "generic":
        monkeypatch.setenv("CULA_FORCE_GENERIC", "1")
    if case == "D128 float scale":
        a["scale"] = 0.25
    fn = cula.chunk_simple_gla if op == "chunk" else cula.fused_recurrent_simple_gla
    r = _fast_seq(fast, op == "recurrent", a)
    assert r is not None, f"{op} {case}: the fast path declined a plain call"
    o_py, ht_py = python_path(fn, **a)
    torch.cuda.synchronize()
    assert torch.equal(r[0], o_py), f"{op} {case}: o differs"
    assert (r[1] is None) == (ht_py is None) and (r[1] is None or torch.equal(r[1], ht_py)), f"{op} {case}: state"


def _misaligned(x):
    flat = torch.empty(x.numel() + 1, device=x.device, dtype=x.dtype)
    y = flat[1:].view(x.shape)
    y.copy_(x)
    return y


# Decode inputs the fast path must leave to the Python path: (name, change, what the public API does:
# an exception type, or None when the Python path accepts it by copying or checking on the host).
DECODE_CASES = [
    ("q float32", lambda a: a.update(q=a["q"].float()), TypeError),
    ("k fp16", lambda a: a.update(k=a["k"].half()), TypeError),
    ("v other shape", lambda a: a.update(v=a["v"][:, :1]), ValueError),
    ("head dim 32", lambda a: a.update(q=a["q"][..., :32], k=a["k"][..., :32], v=a["v"][..., :32]), ValueError),
    ("q 2-d", lambda a: a.update(q=a["q"][0]), ValueError),
    ("q [N, 2, H, K]", lambda a: a.update(q=a["q"][:, None].expand(N, 2, H, D).contiguous()), ValueError),
    ("q non-contiguous", lambda a: a.update(q=a["q"].transpose(0, 1).contiguous().transpose(0, 1)), None),
    ("q misaligned", lambda a: a.update(q=_misaligned(a["q"])), None),
    ("q on the CPU", lambda a: a.update(q=a["q"].cpu()), ValueError),
    ("q a Parameter", lambda a: a.update(q=torch.nn.Parameter(a["q"], requires_grad=False)), None),
    ("q requires grad", lambda a: a.update(q=a["q"].clone().requires_grad_()), NotImplementedError),
    ("q a list", lambda a: a.update(q=[1.0]), TypeError),
    ("state non-contiguous", lambda a: a.update(state=a["state"].transpose(2, 3)), ValueError),
    ("state misaligned", lambda a: a.update(state=_misaligned(a["state"])), ValueError),
    ("state float64", lambda a: a.update(state=a["state"].double()), TypeError),
    ("state other heads", lambda a: a.update(state=a["state"][:, :1].contiguous()), ValueError),
    ("state without indices, P != N", lambda a: a.update(state_indices=None), ValueError),
    ("state None", lambda a: a.update(state=None), TypeError),
    ("indices checked on the host", lambda a: a.update(check_indices=True), None),
    ("indices out of range, checked", lambda a: a.update(check_indices=True,
                                                         state_indices=a["state_indices"] + P), ValueError),
    ("indices float", lambda a: a.update(state_indices=a["state_indices"].float()), TypeError),
    ("indices other length", lambda a: a.update(state_indices=a["state_indices"][:2]), ValueError),
    ("check_indices 0", lambda a: a.update(check_indices=0), TypeError),
    ("scale True", lambda a: a.update(scale=True), TypeError),
    ("scale nan", lambda a: a.update(scale=math.nan), ValueError),
    ("scale text", lambda a: a.update(scale="0.1"), TypeError),
    ("g_gamma float64", lambda a: a.update(g_gamma=a["g_gamma"].double()), TypeError),
    ("g_gamma other length", lambda a: a.update(g_gamma=a["g_gamma"][:1]), ValueError),
    ("g_gamma strided", lambda a: a.update(g_gamma=a["g_gamma"].repeat_interleave(2)[::2]), None),
    ("out other shape", lambda a: a.update(out=torch.empty_like(a["v"])[:2]), ValueError),
    ("out other dtype", lambda a: a.update(out=torch.empty_like(a["v"], dtype=torch.float16)), TypeError),
    ("out non-contiguous", lambda a: a.update(out=torch.empty(H, N, D, device="cuda", dtype=torch.bfloat16)
                                              .transpose(0, 1)), ValueError),
    ("more than 65535 sequences", lambda a: a.update(
        q=torch.zeros(65536, 1, D, device="cuda", dtype=torch.bfloat16),
        k=torch.zeros(65536, 1, D, device="cuda", dtype=torch.bfloat16),
        v=torch.zeros(65536, 1, D, device="cuda", dtype=torch.bfloat16),
        state=a["state"][:, :1].contiguous(), g_gamma=None,
        state_indices=torch.zeros(65536, device="cuda", dtype=torch.int32)), ValueError),
]


@pytest.mark.parametrize("name,change,outcome", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_decode_fast_path_declines(name, change, outcome, fast, python_path):
    a = _decode_args()
    change(a)
    with torch.enable_grad():
        assert _fast_decode(fast, a) is None, f"{name}: the fast path took it"
        if outcome is None:
            b = dict(a, state=a["state"].clone())
            o = cula.simple_gla_decode(**a)
            o_py = python_path(cula.simple_gla_decode, **b)
            torch.cuda.synchronize()
            assert torch.equal(o, o_py) and torch.equal(a["state"], b["state"]), name
        else:
            with pytest.raises(outcome, match=r"^cula"):
                cula.simple_gla_decode(**a)


SEQ_CASES = [
    ("q fp16, k bf16", lambda a: a.update(q=a["q"].half()), TypeError),
    ("T = 0", lambda a: a.update(q=a["q"][:, :0], k=a["k"][:, :0], v=a["v"][:, :0]), ValueError),
    ("k shorter", lambda a: a.update(k=a["k"][:, :5]), ValueError),
    ("K != V", lambda a: a.update(v=torch.cat([a["v"], a["v"]], -1)), ValueError),
    ("q 3-d", lambda a: a.update(q=a["q"][0], k=a["k"][0], v=a["v"][0]), ValueError),
    ("v non-contiguous", lambda a: a.update(v=a["v"].transpose(1, 2).contiguous().transpose(1, 2)), None),
    ("initial_state other batch", lambda a: a.update(initial_state=a["initial_state"][:1]), ValueError),
    ("initial_state fp16", lambda a: a.update(initial_state=a["initial_state"].half()), TypeError),
    ("initial_state non-contiguous", lambda a: a.update(initial_state=a["initial_state"].transpose(2, 3)), None),
    ("output_final_state 1", lambda a: a.update(output_final_state=1), TypeError),
    ("g_gamma on the CPU", lambda a: a.update(g_gamma=a["g_gamma"].cpu()), ValueError),
    ("g_gamma [1, H]", lambda a: a.update(g_gamma=a["g_gamma"][None]), ValueError),
    ("scale inf", lambda a: a.update(scale=math.inf), ValueError),
    ("h0 requires grad", lambda a: a.update(initial_state=a["initial_state"].clone().requires_grad_()),
     NotImplementedError),
]


@pytest.mark.parametrize("op", ["chunk", "recurrent"])
@pytest.mark.parametrize("name,change,outcome", SEQ_CASES, ids=[c[0] for c in SEQ_CASES])
def test_sequence_fast_path_declines(op, name, change, outcome, fast, declined_like_python):
    a = _seq_args()
    change(a)
    fn = cula.chunk_simple_gla if op == "chunk" else cula.fused_recurrent_simple_gla
    with torch.enable_grad():
        assert _fast_seq(fast, op == "recurrent", a) is None, f"{name}: the fast path took it"
        declined_like_python(fn, a, outcome, name)


def test_options_only_the_python_path_knows(fast):
    """Calls with unknown options, g with g_gamma, cu_seqlens_cpu alone or reverse raise the Python
    path's errors (the fast path never takes them); an unapproved device is left to the Python checks."""
    a = _seq_args()
    with pytest.raises(TypeError, match="unexpected keyword"):
        cula.chunk_simple_gla(**a, bogus=1)
    with pytest.raises(ValueError, match="cu_seqlens_cpu is given without cu_seqlens"):
        cula.chunk_simple_gla(**a, cu_seqlens_cpu=torch.tensor([0, 130]))
    with pytest.raises(NotImplementedError, match="g and g_gamma together are not supported"):
        cula.chunk_simple_gla(**a, g=a["g_gamma"])
    with pytest.raises(NotImplementedError, match="reverse=True"):
        cula.fused_recurrent_simple_gla(**a, reverse=True)
    from cula import _loader
    b = _loader.backend()
    saved = dict(b.checked_devices)
    b.checked_devices.clear()
    try:
        assert _fast_seq(fast, False, a) is None, "a device cula has not approved went through the fast path"
    finally:
        b.checked_devices.update(saved)


def test_lightning_decay_lookup(fast, monkeypatch):
    """Lightning calls on torch tensors find their layer's decay without viewing q: each layer gets its
    own, the same as the Python path makes, and the view runs only on the first call of each."""
    a = _decode_args()
    monkeypatch.setattr(lightning_attn, "_G_GAMMA_CACHE", {})
    monkeypatch.setattr(lightning_attn, "_G_GAMMA_TORCH", {})
    views = []
    real_view = lightning_attn.C.view
    monkeypatch.setattr(lightning_attn.C, "view", lambda x, name: views.append(name) or real_view(x, name))
    for layer in (0, 1, 0, 1, 2):
        state = a["state"].clone()
        o = cula.lightning_attn_decode(a["q"], a["k"], a["v"], state, layer, 3, state_indices=a["state_indices"],
                                       check_indices=False)
        want_state = a["state"].clone()
        g = torch.tensor(cula.lightning_attn_g_gamma(H, layer, 3), device="cuda")
        want = cula.simple_gla_decode(a["q"], a["k"], a["v"], want_state, g_gamma=g,
                                      state_indices=a["state_indices"], check_indices=False)
        assert torch.equal(o, want) and torch.equal(state, want_state), f"layer {layer}"
    # the lookups of layers 0 and 1 on their second call made no view of q
    assert views.count("q") == 3, views
    # a new device index, head count or layer count is a new entry, not a wrong hit
    q3 = a["q"][:, :1]
    g1 = lightning_attn._lightning_g_gamma(q3, -2, 1, 3)
    assert g1.shape == (1,) and torch.equal(g1.cpu(), torch.tensor(cula.lightning_attn_g_gamma(1, 1, 3)))
    g4, g3 = (lightning_attn._lightning_g_gamma(a["q"], -2, 1, n).cpu() for n in (4, 3))
    assert not torch.equal(g4, g3)
