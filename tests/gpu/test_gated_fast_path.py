"""The gated recurrence's fast path for torch tensors (native/src/gated_delta_rule_fastpath.cpp):
chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, gated_delta_rule_decode, KDA's three ops
and simple_gla's per-token-gate calls. Against the Python path (cula/_gated.py) it gives bit-identical results
where it runs, plain calls take it, and for every input the Python path rejects, copies or
converts it answers None, so the Python path raises the error that names the argument."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import cula  # noqa: E402
from cula import _checks, _gated  # noqa: E402

B, T, H, HV, D = 2, 130, 2, 4, 64
N, P = 4, 12


# op: (public function, chunked kernel, delta rule, per-key gate)
SEQ_OPS = {
    "chunk_gated_delta_rule": (cula.chunk_gated_delta_rule, True, True, False),
    "fused_recurrent_gated_delta_rule": (cula.fused_recurrent_gated_delta_rule, False, True, False),
    "chunk_kda": (cula.chunk_kda, True, True, True),
    "fused_recurrent_kda": (cula.fused_recurrent_kda, False, True, True),
    "chunk_simple_gla g": (cula.chunk_simple_gla, True, False, False),
    "fused_recurrent_simple_gla g": (cula.fused_recurrent_simple_gla, False, False, False),
}
FLAGS = ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "use_gate_in_kernel")


def _randn(gen, *shape, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)


def _seq_args(delta, dim=D, dtype=torch.bfloat16, v_heads=HV, per_key=False):
    """The public op's keyword arguments (simple_gla's: no beta, no flags, HV = H; KDA's: g [B, T, HV, K])."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    hv = v_heads if delta else H
    keys = (dim,) if per_key else ()
    a = dict(q=_randn(gen, B, T, H, dim, dtype=dtype), k=_randn(gen, B, T, H, dim, scale=dim ** -0.5, dtype=dtype),
             v=_randn(gen, B, T, hv, dim, dtype=dtype),
             g=-torch.rand(B, T, hv, *keys, device="cuda", generator=gen) * 0.2,
             scale=None, initial_state=_randn(gen, B, hv, dim, dim, scale=0.1), output_final_state=True)
    if delta:
        a.update(beta=torch.rand(B, T, hv, device="cuda", generator=gen), use_qk_l2norm_in_kernel=True,
                 use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, use_gate_in_kernel=False,
                 A_log=None, dt_bias=None)
    return a


def _fast_seq(fast, chunked, delta, a, per_key=False):
    return fast.gated_sequence(chunked, delta, a["q"], a["k"], a["v"], a["g"], a.get("beta"), a["scale"],
                               a["initial_state"], a["output_final_state"],
                               *(a.get(name, False) for name in FLAGS), a.get("A_log"), a.get("dt_bias"), per_key,
                               a.get("lower_bound"), a.get("state_v_first", False))


def _gate_in_kernel(a, dt_bias=True):
    """The in-kernel gate; dt_bias [HV], or [HV * K] with KDA's per-key g."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    hv, per_key = a["v"].shape[-2], a["g"].dim() == a["v"].dim()
    a.update(use_gate_in_kernel=True, g=_randn(gen, *a["g"].shape), A_log=torch.rand(hv, device="cuda") - 2,
             dt_bias=_randn(gen, hv * (a["v"].shape[-1] if per_key else 1)) if dt_bias else None)


def _lower_bound(a, a_log=True):
    """KDA's bounded gate, dt_bias [HV, K]."""
    _gate_in_kernel(a)
    a.update(lower_bound=-5.0, dt_bias=a["dt_bias"].view(a["v"].shape[-2], -1))
    if not a_log:
        a["A_log"] = None


SEQ_EQUAL = {
    "state": lambda a: None,
    "no state": lambda a: a.update(initial_state=None),
    "no final state": lambda a: a.update(output_final_state=False),
    "int scale": lambda a: a.update(scale=1),
    "g bfloat16": lambda a: a.update(g=a["g"].bfloat16()),
    "gate in kernel": _gate_in_kernel,
    "gate in kernel, no dt_bias": lambda a: _gate_in_kernel(a, dt_bias=False),
    "beta sigmoid, negative eigenvalues": lambda a: a.update(beta=(a["beta"] - 0.5).half() * 4,
                                                             use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    "l2norm off": lambda a: a.update(use_qk_l2norm_in_kernel=False),
    "no g": lambda a: a.update(g=None),
    "lower bound": _lower_bound,
    "lower bound, no A_log": lambda a: _lower_bound(a, a_log=False),
    "state_v_first": lambda a: a.update(state_v_first=True),
}
DELTA_ONLY = {"gate in kernel", "gate in kernel, no dt_bias", "beta sigmoid, negative eigenvalues", "l2norm off",
              "no g", "state_v_first"}
KDA_ONLY = {"lower bound", "lower bound, no A_log"}


@pytest.mark.parametrize("op", list(SEQ_OPS))
@pytest.mark.parametrize("case", [*SEQ_EQUAL, "H = HV", "fp16 D128", "generic", "two launches"])
def test_sequence_fast_equals_python(op, case, fast, python_path, monkeypatch):
    fn, chunked, delta, per_key = SEQ_OPS[op]
    if case == "two launches":  # the gated delta rule's prefill with its workspace (KDA's always has one)
        if op != "chunk_gated_delta_rule":
            pytest.skip("the gated delta rule's choice of launches")
        monkeypatch.setenv("CULA_GDN_CHUNK_LAUNCHES", "2")
    if case in DELTA_ONLY and not delta:
        pytest.skip("an option of the delta rule")
    if case in KDA_ONLY and not per_key:
        pytest.skip("an option of KDA")
    a = _seq_args(delta, *((128, torch.float16) if case == "fp16 D128" else ()),
                  **({"v_heads": H} if case == "H = HV" else {}), per_key=per_key)
    SEQ_EQUAL.get(case, lambda a: None)(a)
    if case == "generic":
        monkeypatch.setenv("CULA_FORCE_GENERIC", "1")
    r = _fast_seq(fast, chunked, delta, a, per_key)
    assert r is not None, f"{op} {case}: the fast path declined a plain call"
    o_py, ht_py = python_path(fn, **a)
    torch.cuda.synchronize()
    assert torch.equal(r[0], o_py), f"{op} {case}: o differs"
    assert (r[1] is None) == (ht_py is None) and (r[1] is None or torch.equal(r[1], ht_py)), f"{op} {case}: state"


def _decode_args(delta, tokens=None, dim=D, dtype=torch.bfloat16, per_key=False):
    """gated_delta_rule_decode's (simple_gla_decode's with delta=False, kda_decode's with per_key)
    keyword arguments; tokens: [N, T, ...] inputs with [N, T + 1] slot indices (speculative decoding)."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    hv = HV if delta else H
    lead = (N,) if tokens is None else (N, tokens)
    keys = (dim,) if per_key else ()
    a = dict(q=_randn(gen, *lead, H, dim, dtype=dtype), k=_randn(gen, *lead, H, dim, scale=dim ** -0.5, dtype=dtype),
             v=_randn(gen, *lead, hv, dim, dtype=dtype),
             g=-torch.rand(*lead, hv, *keys, device="cuda", generator=gen) * 0.2,
             state=_randn(gen, P, hv, dim, dim, scale=0.1), scale=None, check_indices=False, out=None)
    if tokens is None:
        a["state_indices"] = torch.tensor([3, -1, 0, 7], device="cuda", dtype=torch.int32)
    else:
        a["state_indices"] = torch.arange(N * (tokens + 1), device="cuda", dtype=torch.int32).view(N, -1) % P
    if delta:
        a.update(beta=torch.rand(*lead, hv, device="cuda", generator=gen), use_qk_l2norm_in_kernel=True,
                 use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, use_gate_in_kernel=False,
                 A_log=None, dt_bias=None)
    return a


def _fast_decode(fast, delta, a, per_key=False):
    return fast.gated_decode(delta, a["q"], a["k"], a["v"], a["g"], a.get("beta"), a["state"], a["scale"],
                             a["state_indices"], a["check_indices"], *(a.get(name, False) for name in FLAGS),
                             a.get("A_log"), a.get("dt_bias"), a["out"], per_key, a.get("lower_bound"),
                             a.get("state_v_first", False))


def _decode_fn(delta, per_key=False):
    if delta:
        fn = cula.kda_decode if per_key else cula.gated_delta_rule_decode
        return lambda state, **a: fn(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("g"), a.pop("beta"), state, **a)
    return lambda state, **a: cula.simple_gla_decode(a.pop("q"), a.pop("k"), a.pop("v"), state, **a)


def _packed_rows(a):
    """q, k and v as views of one packed projection's rows (SGLang's mixed_qkv), same values."""
    q, k, v = a["q"], a["k"], a["v"]
    lead = q.shape[:-2]
    rows = torch.cat([x.reshape(*lead, -1) for x in (q, k, v)], -1)
    widths = [x.shape[-2] * x.shape[-1] for x in (q, k, v)]
    parts = rows.split(widths, -1)
    a.update({name: part.view(*lead, x.shape[-2], x.shape[-1])
              for name, part, x in zip(("q", "k", "v"), parts, (q, k, v), strict=True)})
    assert not a["q"].is_contiguous()


DECODE_EQUAL = {
    "indices": lambda a: None,
    "packed rows": _packed_rows,
    "no indices": lambda a: a.update(state_indices=None, state=a["state"][:N].clone()),
    "int64 indices": lambda a: a.update(state_indices=a["state_indices"].long()),
    "out": lambda a: a.update(out=torch.full_like(a["v"], math.nan)),
    "gate in kernel": _gate_in_kernel,
    "float scale": lambda a: a.update(scale=0.3),
    "lower bound": _lower_bound,
    "state_v_first": lambda a: a.update(state_v_first=True),
}
# family: (delta rule, per-key gate)
DECODE_OPS = {"gated_delta_rule_decode": (True, False), "kda_decode": (True, True),
              "simple_gla_decode g": (False, False)}


@pytest.mark.parametrize("op", list(DECODE_OPS))
@pytest.mark.parametrize("case", [*DECODE_EQUAL, "[N, 1, H, K]", "2 tokens, [N, S] slots", "fp16 D128",
                                  "2 tokens, packed rows"])
def test_decode_fast_equals_python(op, case, fast, python_path):
    delta, per_key = DECODE_OPS[op]
    if case in ("gate in kernel", "state_v_first") and not delta:
        pytest.skip("an option of the delta rule")
    if case in KDA_ONLY and not per_key:
        pytest.skip("an option of KDA")
    tokens = {"[N, 1, H, K]": 1, "2 tokens, [N, S] slots": 2, "2 tokens, packed rows": 2}.get(case)
    a = _decode_args(delta, tokens, *((128, torch.float16) if case == "fp16 D128" else ()), per_key=per_key)
    if case == "[N, 1, H, K]":
        a["state_indices"] = torch.tensor([3, -1, 0, 7], device="cuda", dtype=torch.int32)
    DECODE_EQUAL.get(case, _packed_rows if case == "2 tokens, packed rows" else lambda a: None)(a)
    b = dict(a, state=a["state"].clone(), out=None if a["out"] is None else a["out"].clone())
    o_fast = _fast_decode(fast, delta, a, per_key)
    assert o_fast is not None, f"{case}: the fast path declined a plain call"
    if a["out"] is not None:
        assert o_fast is a["out"]
    state_py = b.pop("state")
    o_py = python_path(_decode_fn(delta, per_key), state_py, **b)
    torch.cuda.synchronize()
    assert torch.equal(o_fast, o_py), f"{case}: o differs"
    assert torch.equal(a["state"], state_py), f"{case}: the pool differs"


def _misaligned(x):
    flat = torch.empty(x.numel() + 1, device=x.device, dtype=x.dtype)
    y = flat[1:].view(x.shape)
    y.copy_(x)
    return y


def _cpu(name):
    return lambda a: a.update({name: a[name].cpu()})


# Inputs the fast path must leave to the Python path: (name, change, what the public API does: an
# exception type, or None when the Python path accepts it by copying or checking on the host).
SEQ_DECLINES = [
    ("q fp16, k bf16", lambda a: a.update(q=a["q"].half()), TypeError),
    ("HV not a multiple of H", lambda a: a.update(v=a["v"][:, :, :3].contiguous(), g=a["g"][..., :3].contiguous(),
                                                  beta=a["beta"][..., :3].contiguous(),
                                                  initial_state=a["initial_state"][:, :3].contiguous()), ValueError),
    ("T = 0", lambda a: a.update(**{n: a[n][:, :0] for n in ("q", "k", "v", "g", "beta")}), ValueError),
    ("K != V", lambda a: a.update(v=torch.cat([a["v"], a["v"]], -1)), ValueError),
    ("v non-contiguous", lambda a: a.update(v=a["v"].transpose(1, 2).contiguous().transpose(1, 2)), None),
    ("q misaligned", lambda a: a.update(q=_misaligned(a["q"])), None),
    ("g other shape", lambda a: a.update(g=a["g"][:, :5]), ValueError),
    ("g float64", lambda a: a.update(g=a["g"].double()), TypeError),
    ("g on the CPU", _cpu("g"), ValueError),
    ("beta [B, T, HV, V]", lambda a: a.update(beta=a["beta"][..., None].expand(B, T, HV, D).contiguous()),
     NotImplementedError),
    ("beta non-contiguous", lambda a: a.update(beta=a["beta"].transpose(0, 1).contiguous().transpose(0, 1)), None),
    ("gate in kernel without A_log", lambda a: a.update(use_gate_in_kernel=True), ValueError),
    ("A_log other length", lambda a: (_gate_in_kernel(a), a.update(A_log=a["A_log"][:2])), ValueError),
    ("dt_bias float64", lambda a: (_gate_in_kernel(a), a.update(dt_bias=a["dt_bias"].double())), TypeError),
    ("A_log strided", lambda a: (_gate_in_kernel(a), a.update(A_log=a["A_log"].repeat_interleave(2)[::2])), None),
    ("negative eigenvalues without the sigmoid", lambda a: a.update(allow_neg_eigval=True), ValueError),
    ("use_gate_in_kernel 1", lambda a: a.update(use_gate_in_kernel=1), TypeError),
    ("use_qk_l2norm_in_kernel None", lambda a: a.update(use_qk_l2norm_in_kernel=None), TypeError),
    ("output_final_state 1", lambda a: a.update(output_final_state=1), TypeError),
    ("initial_state other heads", lambda a: a.update(initial_state=a["initial_state"][:, :2].contiguous()),
     ValueError),
    ("initial_state non-contiguous", lambda a: a.update(initial_state=a["initial_state"].transpose(2, 3)), None),
    ("initial_state requires grad", lambda a: a.update(initial_state=a["initial_state"].clone().requires_grad_()),
     NotImplementedError),
    ("scale nan", lambda a: a.update(scale=math.nan), ValueError),
    ("scale True", lambda a: a.update(scale=True), TypeError),
    ("state_v_first 1", lambda a: a.update(state_v_first=1), TypeError),
]


@pytest.mark.parametrize("op", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
@pytest.mark.parametrize("name,change,outcome", SEQ_DECLINES, ids=[c[0] for c in SEQ_DECLINES])
def test_sequence_fast_path_declines(op, name, change, outcome, fast, declined_like_python):
    fn, chunked, delta, _ = SEQ_OPS[op]
    a = _seq_args(delta)
    change(a)
    with torch.enable_grad():
        assert _fast_seq(fast, chunked, delta, a) is None, f"{name}: the fast path took it"
        declined_like_python(fn, a, outcome, name)


# KDA's gate: what the fast path leaves to the Python path (lower_bound arrives checked there)
KDA_DECLINES = [
    ("g [B, T, HV]", lambda a: a.update(g=a["g"][..., 0].contiguous()), ValueError),
    ("g [B, T, HV, K/2]", lambda a: a.update(g=a["g"][..., ::2].contiguous()), ValueError),
    ("dt_bias [HV]", lambda a: (_gate_in_kernel(a), a.update(dt_bias=a["dt_bias"][:HV].contiguous())), ValueError),
    ("dt_bias [HV, K] strided", lambda a: (_lower_bound(a), a.update(dt_bias=a["dt_bias"].t().contiguous().t())),
     None),
    ("lower_bound int", lambda a: (_lower_bound(a), a.update(lower_bound=-5)), None),
    ("no A_log, no lower_bound", lambda a: (_gate_in_kernel(a), a.update(A_log=None)), ValueError),
]


@pytest.mark.parametrize("op", ["chunk_kda", "fused_recurrent_kda"])
@pytest.mark.parametrize("name,change,outcome", KDA_DECLINES, ids=[c[0] for c in KDA_DECLINES])
def test_kda_fast_path_declines(op, name, change, outcome, fast, declined_like_python):
    fn, chunked, delta, per_key = SEQ_OPS[op]
    a = _seq_args(delta, per_key=True)
    change(a)
    assert _fast_seq(fast, chunked, delta, a, per_key) is None, f"{name}: the fast path took it"
    declined_like_python(fn, a, outcome, name)


def test_simple_gla_g_declines(fast):
    """simple_gla's per-token gate: g with g_gamma, g with other heads than v, and v with other heads
    than q (no grouped value heads without the delta rule) go to the Python path, which raises."""
    a = _seq_args(False)
    for fn, chunked in ((cula.chunk_simple_gla, True), (cula.fused_recurrent_simple_gla, False)):
        with pytest.raises(NotImplementedError, match="g and g_gamma together"):
            fn(**a, g_gamma=a["g"][0, 0])
        b = dict(a, g=torch.cat([a["g"], a["g"]], -1))
        assert _fast_seq(fast, chunked, False, b) is None
        with pytest.raises(ValueError, match="^cula"):
            fn(**b)
        b = dict(a, v=torch.cat([a["v"], a["v"]], -2), g=torch.cat([a["g"], a["g"]], -1))
        assert _fast_seq(fast, chunked, False, b) is None
        with pytest.raises(ValueError, match="^cula"):
            fn(**b)
        b = dict(a, state_v_first=True)  # (value-first states: the delta-rule families only)
        assert _fast_seq(fast, chunked, False, b) is None
        with pytest.raises(NotImplementedError, match="state_v_first=True"):
            fn(**b)


DECODE_DECLINES = [
    ("indices checked on the host", lambda a: a.update(check_indices=True), None),
    ("indices out of range, checked", lambda a: a.update(check_indices=True, state_indices=a["state_indices"] + P),
     ValueError),
    ("indices float", lambda a: a.update(state_indices=a["state_indices"].float()), TypeError),
    ("indices other length", lambda a: a.update(state_indices=a["state_indices"][:2]), ValueError),
    ("indices non-contiguous", lambda a: a.update(
        state_indices=a["state_indices"].repeat_interleave(2)[::2]), None),
    ("check_indices 0", lambda a: a.update(check_indices=0), TypeError),
    ("state non-contiguous", lambda a: a.update(state=a["state"].transpose(2, 3)), ValueError),
    ("state misaligned", lambda a: a.update(state=_misaligned(a["state"])), ValueError),
    ("state other heads", lambda a: a.update(state=a["state"][:, :2].contiguous()), ValueError),
    ("state without indices, P != N", lambda a: a.update(state_indices=None), ValueError),
    ("state float64", lambda a: a.update(state=a["state"].double()), TypeError),
    ("q 2-d", lambda a: a.update(q=a["q"][0]), ValueError),
    ("g [N]", lambda a: a.update(g=a["g"][:, 0].contiguous()), ValueError),
    ("beta float64", lambda a: a.update(beta=a["beta"].double()), TypeError),
    ("g on the CPU", _cpu("g"), ValueError),
    ("q requires grad", lambda a: a.update(q=a["q"].clone().requires_grad_()), NotImplementedError),
    ("out other dtype", lambda a: a.update(out=torch.empty_like(a["v"], dtype=torch.float16)), TypeError),
    ("out non-contiguous", lambda a: a.update(out=torch.empty(HV, N, D, device="cuda", dtype=torch.bfloat16)
                                              .transpose(0, 1)), ValueError),
    ("negative eigenvalues without the sigmoid", lambda a: a.update(allow_neg_eigval=True), ValueError),
    ("state_v_first None", lambda a: a.update(state_v_first=None), TypeError),
    # rows the token loop cannot read where they lie (copied by the Python path)
    ("q rows 4 elements apart", lambda a: a.update(
        q=torch.cat([a["q"].flatten(1), a["q"][:, 0, :4]], 1)[:, :H * D].view(N, H, D)), None),
    ("v heads not dense", lambda a: a.update(v=a["v"].transpose(0, 1).contiguous().transpose(0, 1)), None),
]


@pytest.mark.parametrize("name,change,outcome", DECODE_DECLINES, ids=[c[0] for c in DECODE_DECLINES])
def test_decode_fast_path_declines(name, change, outcome, fast, python_path):
    a = _decode_args(True)
    change(a)
    fn = _decode_fn(True)
    with torch.enable_grad():
        assert _fast_decode(fast, True, a) is None, f"{name}: the fast path took it"
        if outcome is None:
            b = dict(a, state=a["state"].clone())
            state, state_py = a.pop("state"), b.pop("state")
            o = fn(state, **a)
            o_py = python_path(fn, state_py, **b)
            torch.cuda.synchronize()
            assert torch.equal(o, o_py) and torch.equal(state, state_py), name
        else:
            with pytest.raises(outcome, match=r"^cula"):
                fn(a.pop("state"), **a)


def test_decode_spec_slots_shorter_than_tokens(fast):
    """[N, S] slots with S < T: the fast path declines, the Python path names the problem."""
    a = _decode_args(True, tokens=2)
    a["state_indices"] = a["state_indices"][:, :1].contiguous()
    assert _fast_decode(fast, True, a) is None
    with pytest.raises(ValueError, match="needs a slot per token"):
        _decode_fn(True)(a.pop("state"), **a)


def test_plain_calls_take_the_fast_path(fast, monkeypatch):
    """The public ops' plain calls never reach the Python path's launch; calls with cu_seqlens, a
    state pool through fused_recurrent or num_accepted_tokens do."""
    launched = []
    real = _gated.launch
    monkeypatch.setattr(_gated, "launch", lambda *args, **kw: launched.append(1) or real(*args, **kw))
    for fn, _, delta, per_key in SEQ_OPS.values():
        fn(**_seq_args(delta, per_key=per_key))
    for delta, per_key in DECODE_OPS.values():
        d = _decode_args(delta, per_key=per_key)
        _decode_fn(delta, per_key)(d.pop("state"), **d)
    a = _seq_args(True)
    assert launched == [], f"{len(launched)} plain calls went through the Python path"
    flat = {n: a[n].reshape(1, B * T, *a[n].shape[2:]) for n in ("q", "k", "v", "g", "beta")}
    cu = torch.tensor([0, T, 2 * T], device="cuda", dtype=torch.int32)
    cula.chunk_gated_delta_rule(**flat, cu_seqlens=cu)
    d = _decode_args(True, tokens=2)
    accepted = torch.tensor([1, 2, 3, 1], device="cuda", dtype=torch.int32)
    _decode_fn(True)(d.pop("state"), num_accepted_tokens=accepted, **d)
    assert len(launched) == 2


def test_unchecked_decodes_take_the_fast_path(fast, python_path, monkeypatch):
    """With CULA_CHECK_VALUES=0 every decode with slots and check_indices left True takes the C fast
    path, as check_indices=False does (the gated decodes, simple_gla_decode with g and with g_gamma,
    Lightning's): no Python path, whose launches all run C.run_later, and o and the pool bit for bit
    those of the Python path's checked call. Checked, the same calls take the Python path."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    gamma_state = _randn(gen, P, H, D, D, scale=0.1)
    calls = {op: (_decode_fn(delta, per_key), _decode_args(delta, per_key=per_key))
             for op, (delta, per_key) in DECODE_OPS.items()}
    gamma = dict(calls["simple_gla_decode g"][1], state=gamma_state, g=None, g_gamma=-torch.rand(H, device="cuda"))
    calls["simple_gla_decode g_gamma"] = (_decode_fn(False), gamma)
    calls["lightning_attn_decode"] = (
        lambda state, **a: cula.lightning_attn_decode(a.pop("q"), a.pop("k"), a.pop("v"), state, 3, 8, **a),
        {n: gamma[n] for n in ("q", "k", "v", "state", "state_indices")})
    ran_later = []
    real = _checks.run_later
    monkeypatch.setattr(_checks, "run_later", lambda later: ran_later.append(1) or real(later))
    for op, (fn, a) in calls.items():
        rest = {n: x for n, x in a.items() if n != "state"} | {"check_indices": True}
        want_pool, got_pool = a["state"].clone(), a["state"].clone()
        want = python_path(fn, want_pool, **rest)
        assert ran_later, f"{op}: the checked call's Python path"
        ran_later.clear()
        monkeypatch.setenv("CULA_CHECK_VALUES", "0")
        got = fn(got_pool, **rest)
        monkeypatch.delenv("CULA_CHECK_VALUES")
        assert not ran_later, f"{op}: CULA_CHECK_VALUES=0 went through the Python path"
        torch.cuda.synchronize()
        assert torch.equal(got, want) and torch.equal(got_pool, want_pool), f"{op}: not the checked call's bits"
        fn(got_pool.clone(), **rest)
        assert ran_later, f"{op}: checked, the call took the fast path"
        ran_later.clear()


# The chunked prefills whose kernels share a workspace between launches (taken from torch's caching
# allocator without a tensor, and given back once the launches are enqueued): KDA, the gated delta
# rule in two launches, and simple_gla and the gated delta rule with one long sequence split over
# the SMs.
WORKSPACE_CALLS = {
    "chunk_kda": lambda a: cula.chunk_kda(**a),
    "chunk_gated_delta_rule two launches": lambda a: cula.chunk_gated_delta_rule(**a),
    "chunk_simple_gla split": lambda a: cula.chunk_simple_gla(**a, output_final_state=True),
    "chunk_gated_delta_rule split": lambda a: _split(lambda: cula.chunk_gated_delta_rule(**a)),
}


def _split(fn):
    """fn() with one sequence in two segments (CULA_GDN_SPLIT=2; common/split.cuh)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CULA_GDN_SPLIT", "2")
        return fn()


def _workspace_args(name):
    if name.endswith("delta_rule split"):  # (one sequence of 130 tokens: segments of 66 and 64)
        return {n: x[:1] if isinstance(x, torch.Tensor) else x for n, x in _seq_args(True).items()}
    if "simple_gla" not in name:
        return _seq_args(True, per_key=name == "chunk_kda")
    gen = torch.Generator(device="cuda").manual_seed(9)  # one sequence of 64 chunks, 2 heads: split in 8
    a = {n: _randn(gen, 1, 4096, H, D, dtype=torch.bfloat16) for n in ("q", "k", "v")}
    return {**a, "g_gamma": -torch.rand(H, device="cuda", generator=gen)}


@pytest.mark.parametrize("name", list(WORKSPACE_CALLS))
def test_workspace_goes_back_to_torch(name, fast, monkeypatch):
    """A call holds nothing of torch's memory afterwards but its outputs: the workspace went back."""
    monkeypatch.setenv("CULA_GDN_CHUNK_LAUNCHES", "2")
    a = _workspace_args(name)
    WORKSPACE_CALLS[name](a)  # (warm-up: the allocator's first blocks)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    outs = WORKSPACE_CALLS[name](a)
    torch.cuda.synchronize()
    held = sum(-(-x.untyped_storage().nbytes() // 512) * 512 for x in outs if x is not None)
    assert torch.cuda.memory_allocated() - before == held, f"{name}: memory held beyond the outputs"
    del outs


@pytest.mark.parametrize("name", list(WORKSPACE_CALLS))
def test_workspace_calls_in_cuda_graph(name, fast, monkeypatch):
    """Captured with torch.cuda.graph (the workspace then comes from the graph's pool) and replayed
    on new inputs, the prefill equals the eager call."""
    monkeypatch.setenv("CULA_GDN_CHUNK_LAUNCHES", "2")
    bufs = _workspace_args(name)
    WORKSPACE_CALLS[name](bufs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = WORKSPACE_CALLS[name](bufs)
    for step in (1, 2):
        gen = torch.Generator(device="cuda").manual_seed(100 + step)
        for x in (bufs[n] for n in ("q", "k", "v")):
            x.copy_(_randn(gen, *x.shape, dtype=x.dtype))
        want = WORKSPACE_CALLS[name](bufs)
        graph.replay()
        torch.cuda.synchronize()
        for w, got in zip(want, outs, strict=True):
            assert (w is None) == (got is None) and (w is None or torch.equal(w, got)), f"{name} step {step}"
