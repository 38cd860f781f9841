"""cula inside torch.compile, CUDA graphs and FLA: every public op under torch.compile(fullgraph=True)
equals the eager call; torch.library.opcheck passes for each custom op; a decode step of every
family replays in a CUDA graph, also through torch.compile(mode="reduce-overhead"); with FLA 0.6.0
installed, ``import cula.fla`` makes FLA's own entry points run cula's kernels."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import cula  # noqa: E402
from cula import _torch, sglang  # noqa: E402

N, H, HV, D = 3, 2, 4, 64


def _rand(gen, *shape, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)


def inputs(seed=0):
    """One set of arrays every case draws from (bf16 q/k/v, f32 gates and states)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t = 70
    x = dict(
        q=_rand(gen, N, t, H, D), k=_rand(gen, N, t, H, D, scale=D ** -0.5), v=_rand(gen, N, t, H, D),
        vv=_rand(gen, N, t, HV, D), g=-torch.rand(N, t, HV, device="cuda", generator=gen) * 0.2,
        beta=torch.rand(N, t, HV, device="cuda", generator=gen), gamma=-torch.rand(H, device="cuda", generator=gen),
        h0=_rand(gen, N, H, D, D, scale=0.1, dtype=torch.float32),
        h0v=_rand(gen, N, HV, D, D, scale=0.1, dtype=torch.float32),
        pool=_rand(gen, 8, H, D, D, scale=0.1, dtype=torch.float32),
        poolv=_rand(gen, 10, HV, D, D, scale=0.1, dtype=torch.float32),
        A_log=torch.rand(HV, device="cuda", generator=gen) - 2, dt_bias=torch.randn(HV, device="cuda", generator=gen),
    )
    x["gk"] = -torch.rand(N, t, HV, D, device="cuda", generator=gen) * 0.2  # KDA's per-key gate
    x["dt_bias_k"] = torch.randn(HV * D, device="cuda", generator=gen)  # and its dt_bias
    x["cu"] = torch.tensor([0, 0, 61, 150, 210], device="cuda", dtype=torch.int32)  # an empty sequence first
    x["slots"] = torch.tensor([5, -1, 2], device="cuda", dtype=torch.int32)  # -1: a padding slot
    x["slots2"] = torch.tensor([[1, 7, 3], [4, 0, 9], [2, 8, 6]], device="cuda", dtype=torch.int64)
    x["accepted"] = torch.tensor([1, 3, 2], device="cuda", dtype=torch.int32)
    x["slots4"] = torch.tensor([5, 3, -1, 9], device="cuda", dtype=torch.int64)  # (a slot for each sequence of cu)
    x["cache"] = torch.zeros(4, 3, HV, D, D, device="cuda")  # [C, steps, HV, V, K]
    x["parents"] = torch.tensor([[-1, 0, 0], [-1, 0, 1], [-1, 0, 0]], device="cuda", dtype=torch.int64)  # EAGLE trees
    x["cache_slots"] = torch.tensor([2, 0, 1], device="cuda", dtype=torch.int32)  # (SGLang's verify cache)
    return x


def flat(x, n=None):
    """[N, T, ...] -> [1, N*T, ...] (varlen) or the first n tokens of each sequence."""
    return x.reshape(1, -1, *x.shape[2:]) if n is None else x[:, :n].contiguous()


# Each case calls public ops the way users do and returns every tensor they produce or update.
CASES = {
    "chunk_simple_gla": lambda x: cula.chunk_simple_gla(x["q"], x["k"], x["v"], g_gamma=x["gamma"],
                                                        initial_state=x["h0"], output_final_state=True),
    "chunk_simple_gla_g_varlen": lambda x: cula.chunk_simple_gla(
        flat(x["q"]), flat(x["k"]), flat(x["v"]), g=flat(x["g"][..., :H].contiguous()), cu_seqlens=x["cu"],
        cu_seqlens_cpu=x["cu"].cpu(), output_final_state=True),
    "fused_recurrent_simple_gla": lambda x: cula.fused_recurrent_simple_gla(
        x["q"], x["k"], x["v"], g_gamma=x["gamma"], scale=0.2, initial_state=x["h0"], output_final_state=True),
    "simple_gla_decode": lambda x: (cula.simple_gla_decode(x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], x["pool"],
                                                           g_gamma=x["gamma"], state_indices=x["slots"]), x["pool"]),
    "chunk_lightning_attn": lambda x: cula.chunk_lightning_attn(x["q"], x["k"], x["v"], 2, 8, initial_state=x["h0"],
                                                                output_final_state=True),
    "fused_recurrent_lightning_attn": lambda x: cula.fused_recurrent_lightning_attn(x["q"], x["k"], x["v"], 2, 8),
    "lightning_attn_decode": lambda x: (cula.lightning_attn_decode(
        x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], x["pool"], 2, 8, state_indices=x["slots"],
        out=torch.empty_like(x["v"][:, 0])), x["pool"]),
    "chunk_gated_delta_rule": lambda x: cula.chunk_gated_delta_rule(
        flat(x["q"]), flat(x["k"]), flat(x["vv"]), flat(x["g"]), flat(x["beta"]),
        initial_state=torch.cat([x["h0v"], x["h0v"][:1]]), output_final_state=True, use_qk_l2norm_in_kernel=True,
        cu_seqlens=x["cu"], use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"]),
    "fused_recurrent_gated_delta_rule": lambda x: cula.fused_recurrent_gated_delta_rule(
        x["q"], x["k"], x["vv"], g=x["g"], beta=x["beta"], initial_state=x["h0v"], output_final_state=True,
        use_qk_l2norm_in_kernel=True),
    # vLLM's speculative-decoding call: a state pool, one slot per token, the accepted prefix's state
    "fused_recurrent_gated_delta_rule_pool": lambda x: (*cula.fused_recurrent_gated_delta_rule(
        flat(x["q"], 3).reshape(1, 9, H, D), flat(x["k"], 3).reshape(1, 9, H, D),
        flat(x["vv"], 3).reshape(1, 9, HV, D), g=flat(x["g"], 3).reshape(1, 9, HV),
        beta=flat(x["beta"], 3).reshape(1, 9, HV), initial_state=x["poolv"], inplace_final_state=True,
        cu_seqlens=torch.arange(0, 10, 3, device="cuda", dtype=torch.int32), ssm_state_indices=x["slots2"],
        num_accepted_tokens=x["accepted"], use_qk_l2norm_in_kernel=True),),
    # the same with EAGLE trees (vLLM's retrieve_parent_token)
    "fused_recurrent_gated_delta_rule_tree": lambda x: (*cula.fused_recurrent_gated_delta_rule(
        flat(x["q"], 3).reshape(1, 9, H, D), flat(x["k"], 3).reshape(1, 9, H, D),
        flat(x["vv"], 3).reshape(1, 9, HV, D), g=flat(x["g"], 3).reshape(1, 9, HV),
        beta=flat(x["beta"], 3).reshape(1, 9, HV), initial_state=x["poolv"], inplace_final_state=True,
        cu_seqlens=torch.arange(0, 10, 3, device="cuda", dtype=torch.int32), ssm_state_indices=x["slots2"],
        num_accepted_tokens=x["accepted"], retrieve_parent_token=x["parents"], use_qk_l2norm_in_kernel=True),),
    # SGLang's target verify: the pool read, the state after each draft token to the cache, a tree
    "sglang_verify": lambda x: (sglang.fused_sigmoid_gating_delta_rule_update(
        x["A_log"], flat(x["g"], 3).reshape(9, HV), x["dt_bias"], 1.0, 20.0, flat(x["q"], 3).reshape(1, 9, H, D),
        flat(x["k"], 3).reshape(1, 9, H, D), flat(x["vv"], 3).reshape(1, 9, HV, D), flat(x["beta"], 3).reshape(9, HV),
        x["poolv"], x["slots"], cu_seqlens=torch.arange(0, 10, 3, device="cuda", dtype=torch.int32),
        use_qk_l2norm_in_kernel=True, disable_state_update=True, intermediate_states_buffer=x["cache"],
        intermediate_state_indices=x["cache_slots"], cache_steps=3, retrieve_parent_token=x["parents"]),
        x["cache"], x["poolv"]),
    "sglang_verify_kda": lambda x: (sglang.fused_sigmoid_gating_delta_rule_update(
        x["A_log"], flat(x["gk"], 3).reshape(9, HV * D), x["dt_bias_k"].reshape(HV, D), 1.0, 20.0,
        flat(x["q"], 3).reshape(1, 9, H, D), flat(x["k"], 3).reshape(1, 9, H, D),
        flat(x["vv"], 3).reshape(1, 9, HV, D), flat(x["beta"], 3).reshape(9, HV), x["poolv"], x["slots"],
        cu_seqlens=torch.arange(0, 10, 3, device="cuda", dtype=torch.int32), use_qk_l2norm_in_kernel=True,
        is_kda=True, intermediate_states_buffer=x["cache"], intermediate_state_indices=x["cache_slots"]),
        x["cache"], x["poolv"]),
    # SGLang's packed decode: q, k, v views of one projection's rows, o into out
    "sglang_packed_decode": lambda x: sglang.fused_recurrent_gated_delta_rule_packed_decode(
        torch.cat([x["q"][:, 0].flatten(1), x["k"][:, 0].flatten(1), x["vv"][:, 0].flatten(1)], 1),
        x["g"][:, 0], x["beta"][:, 0], x["A_log"], x["dt_bias"], 0.1, x["poolv"],
        torch.empty(N, 1, HV, D, device="cuda", dtype=torch.bfloat16), x["slots"], use_qk_l2norm_in_kernel=True),
    # (no padding slot here: a padding sequence's per-token states are left unwritten)
    "fused_recurrent_gated_delta_rule_per_token": lambda x: cula.fused_recurrent_gated_delta_rule(
        flat(x["q"], 2), flat(x["k"], 2), flat(x["vv"], 2), g=flat(x["g"], 2), beta=flat(x["beta"], 2),
        initial_state=x["poolv"], ssm_state_indices=x["slots"].abs(), inplace_final_state=False),
    "gated_delta_rule_decode": lambda x: (cula.gated_delta_rule_decode(
        flat(x["q"], 3), flat(x["k"], 3), flat(x["vv"], 3), flat(x["g"], 3), flat(x["beta"], 3), x["poolv"],
        state_indices=x["slots2"], num_accepted_tokens=x["accepted"], use_qk_l2norm_in_kernel=True), x["poolv"]),
    "chunk_kda": lambda x: cula.chunk_kda(
        flat(x["q"]), flat(x["k"]), flat(x["vv"]), flat(x["gk"]), flat(x["beta"]),
        initial_state=torch.cat([x["h0v"], x["h0v"][:1]]), output_final_state=True, use_qk_l2norm_in_kernel=True,
        cu_seqlens=x["cu"], use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0, A_log=x["A_log"],
        dt_bias=x["dt_bias_k"], use_beta_sigmoid_in_kernel=True),
    "fused_recurrent_kda": lambda x: cula.fused_recurrent_kda(
        x["q"], x["k"], x["vv"], x["gk"], x["beta"], initial_state=x["h0v"], output_final_state=True,
        use_qk_l2norm_in_kernel=True),
    # vLLM's Kimi Linear decode: a pool, one slot per token, the accepted prefix's state, out=
    "fused_recurrent_kda_pool": lambda x: (*cula.fused_recurrent_kda(
        flat(x["q"], 3).reshape(1, 9, H, D), flat(x["k"], 3).reshape(1, 9, H, D),
        flat(x["vv"], 3).reshape(1, 9, HV, D), flat(x["gk"], 3).reshape(1, 9, HV, D),
        flat(x["beta"], 3).reshape(1, 9, HV), initial_state=x["poolv"], inplace_final_state=True,
        cu_seqlens=torch.arange(0, 10, 3, device="cuda", dtype=torch.int32), ssm_state_indices=x["slots2"],
        num_accepted_tokens=x["accepted"], use_qk_l2norm_in_kernel=True,
        out=torch.empty(1, 9, HV, D, device="cuda", dtype=torch.bfloat16)),),
    "fused_recurrent_kda_per_token": lambda x: cula.fused_recurrent_kda(
        flat(x["q"], 2), flat(x["k"], 2), flat(x["vv"], 2), flat(x["gk"], 2), flat(x["beta"], 2),
        initial_state=x["poolv"], ssm_state_indices=x["slots"].abs(), inplace_final_state=False,
        use_gate_in_kernel=True, dt_bias=x["dt_bias_k"], lower_bound=-3.0),
    "kda_decode": lambda x: (cula.kda_decode(
        flat(x["q"], 3), flat(x["k"], 3), flat(x["vv"], 3), flat(x["gk"], 3), flat(x["beta"], 3), x["poolv"],
        state_indices=x["slots2"], num_accepted_tokens=x["accepted"], use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias_k"]), x["poolv"]),
    # value-first states ([N, HV, V, K], FLA's state_v_first; SGLang's pools)
    "chunk_gated_delta_rule_v_first": lambda x: cula.chunk_gated_delta_rule(
        x["q"], x["k"], x["vv"], x["g"], x["beta"], initial_state=x["h0v"], output_final_state=True,
        state_v_first=True),
    "fused_recurrent_kda_v_first": lambda x: cula.fused_recurrent_kda(
        x["q"], x["k"], x["vv"], x["gk"], x["beta"], initial_state=x["h0v"], output_final_state=True,
        state_v_first=True),
    "kda_decode_v_first": lambda x: (cula.kda_decode(
        flat(x["q"], 3), flat(x["k"], 3), flat(x["vv"], 3), flat(x["gk"], 3), flat(x["beta"], 3), x["poolv"],
        state_indices=x["slots2"], num_accepted_tokens=x["accepted"], state_v_first=True), x["poolv"]),
    # SGLang's extend: a value-first pool read at the slots and written back in place (a padding slot)
    "chunk_gated_delta_rule_pool": lambda x: cula.chunk_gated_delta_rule(
        flat(x["q"]), flat(x["k"]), flat(x["vv"]), flat(x["g"]), flat(x["beta"]), initial_state=x["poolv"],
        initial_state_indices=x["slots4"], cu_seqlens=x["cu"], state_v_first=True, use_qk_l2norm_in_kernel=True,
        head_first=False),
    # the pool only read (inplace_update=False), the final states returned
    "chunk_kda_pool_read": lambda x: (*cula.chunk_kda(
        flat(x["q"]), flat(x["k"]), flat(x["vv"]), flat(x["gk"]), flat(x["beta"]), initial_state=x["poolv"],
        initial_state_indices=x["slots4"].abs(), inplace_update=False, output_final_state=True, cu_seqlens=x["cu"],
        use_qk_l2norm_in_kernel=True), x["poolv"]),
}


def tensors(result):
    return [t for t in (result if isinstance(result, tuple) else (result,)) if t is not None]


def assert_same(want, got, what):
    want, got = tensors(want), tensors(got)
    assert len(want) == len(got), what
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}[{i}]: {b.shape} {b.dtype} vs {a.shape} {a.dtype}"
        assert torch.equal(a, b), f"{what}[{i}]: max |diff| {(a.float() - b.float()).abs().max().item():.3e}"


@pytest.mark.parametrize("case", list(CASES))
def test_compile_fullgraph_equals_eager(case):
    """torch.compile(fullgraph=True) (Inductor) traces the op with no graph break and gives the
    eager result bit for bit, in-place updates of pools included."""
    torch._dynamo.reset()
    fn = CASES[case]
    want = fn(inputs())
    got = torch.compile(fn, fullgraph=True)(inputs())
    torch.cuda.synchronize()
    assert_same(want, got, case)


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(case, monkeypatch):
    """torch.library.opcheck (schema and declared mutations, fake implementation, autograd
    registration, AOT dispatch with dynamic shapes) on the custom-op calls the public op makes,
    and the public op through its custom op equals the eager path."""
    calls, inside = [], []

    def recorder(op):
        def call(*args):
            calls.append((op, args))
            inside.append(op)  # the op's implementation is the public op: its eager path
            try:
                return op(*args)
            finally:
                inside.pop()
        return call

    want = CASES[case](inputs())
    monkeypatch.setattr(_torch, "is_compiling", lambda: not inside)  # the traced path, run eagerly
    for name, op in list(_torch._ops.items()):
        monkeypatch.setitem(_torch._ops, name, recorder(op))
    got = CASES[case](inputs())
    assert calls, f"{case}: no custom op was called"
    assert_same(want, got, case)
    monkeypatch.undo()
    for op, args in calls:
        torch.library.opcheck(op, args)


DECODES = {
    "simple_gla": lambda b, x, out: cula.simple_gla_decode(b["q"], b["k"], b["v"], x["pool"], g_gamma=x["gamma"],
                                                           state_indices=x["slots"], out=out),
    "lightning_attn": lambda b, x, out: cula.lightning_attn_decode(b["q"], b["k"], b["v"], x["pool"], 1, 4,
                                                                   state_indices=x["slots"], out=out),
    "simple_gla_per_token_g": lambda b, x, out: cula.simple_gla_decode(
        b["q"], b["k"], b["v"], x["pool"], g=b["g"][:, :H].contiguous(), state_indices=x["slots"], out=out),
    "gated_delta_rule": lambda b, x, out: cula.gated_delta_rule_decode(
        b["q"], b["k"], b["vv"], b["g"], b["beta"], x["poolv"], state_indices=x["slots"],
        use_qk_l2norm_in_kernel=True, out=out),
    "kda": lambda b, x, out: cula.kda_decode(
        b["q"], b["k"], b["vv"], b["gk"], b["beta"], x["poolv"], state_indices=x["slots"],
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias_k"],
        lower_bound=-5.0, use_beta_sigmoid_in_kernel=True, out=out),
}


def step_inputs(seed):
    x = inputs(seed)
    return {name: x[name][:, 0].contiguous() for name in ("q", "k", "v", "vv", "g", "beta", "gk")}


@pytest.mark.parametrize("family", list(DECODES))
def test_decode_step_in_cuda_graph(family):
    """A decode step captured with torch.cuda.graph (indices checked by default: no host copy may
    run during capture) and replayed on new inputs equals the eager call."""
    x = inputs()
    bufs = step_inputs(0)
    out = torch.empty_like(bufs["vv" if family in ("gated_delta_rule", "kda") else "v"])
    DECODES[family](bufs, inputs(), out)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        DECODES[family](bufs, x, out)
    for step in (1, 2):
        new = step_inputs(step)
        for name in bufs:
            bufs[name].copy_(new[name])
        want_x = {name: t.clone() for name, t in x.items()}
        want = DECODES[family](bufs, want_x, None)
        graph.replay()
        torch.cuda.synchronize()
        assert_same((want, want_x["pool"], want_x["poolv"]), (out, x["pool"], x["poolv"]), f"{family} step {step}")


@pytest.mark.parametrize("family", list(DECODES))
# torch's cudagraph trees capture an empty graph when they start, and warn about it themselves
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty:UserWarning")
def test_decode_step_reduce_overhead(family):
    """torch.compile(mode="reduce-overhead"): the decode step runs from CUDA graphs (no cudagraph
    skips), the state pool a static buffer updated in place as in serving engines."""
    from torch._dynamo.utils import counters

    class Step(torch.nn.Module):
        def __init__(self, x):
            super().__init__()
            self.x = x
            for name in ("pool", "poolv"):
                self.register_buffer(name, x[name])

        def forward(self, q, k, v, vv, g, beta, gk):
            b = dict(q=q, k=k, v=v, vv=vv, g=g, beta=beta, gk=gk)
            return DECODES[family](b, dict(self.x, pool=self.pool, poolv=self.poolv), None) * 1

    torch._dynamo.reset()
    counters.clear()
    x = inputs()
    want_x = {name: t.clone() for name, t in x.items()}
    step = torch.compile(Step(x), mode="reduce-overhead", fullgraph=True)
    for i in range(4):
        b = step_inputs(10 + i)
        want = DECODES[family](b, want_x, None)
        got = step(**b).clone()
        torch.cuda.synchronize()
        assert_same((want, want_x["pool"], want_x["poolv"]), (got, step.pool, step.poolv), f"{family} call {i}")
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


# FLA's backend registry: FLA's own entry points run cula's kernels after `import cula.fla`.
def _fla_or_skip():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import fla.backends  # noqa: F401
            import fla.ops.gated_delta_rule as gdn
            import fla.ops.kda  # noqa: F401
            import fla.ops.simple_gla as sg
    except ImportError as e:
        pytest.skip(f"FLA 0.6.0 (fla-core) is not installed: {e}")
    import cula.fla  # noqa: F401
    return gdn, sg


def _kda():
    import fla.ops.kda
    return fla.ops.kda


def _kda_call(fn, x, **kw):
    return fn(x["q"], x["k"], x["vv"], x["gk"], x["beta"], initial_state=x["h0v"], output_final_state=True,
              use_qk_l2norm_in_kernel=True, **kw)


FLA_CALLS = {
    "chunk_kda": lambda gdn, sg, x: _kda_call(_kda().chunk_kda, x),
    "fused_recurrent_kda": lambda gdn, sg, x: _kda_call(_kda().fused_recurrent_kda, x),
    "chunk_kda_v_first": lambda gdn, sg, x: _kda_call(_kda().chunk_kda, x, state_v_first=True),
    "fused_recurrent_kda_v_first": lambda gdn, sg, x: _kda_call(_kda().fused_recurrent_kda, x, state_v_first=True),
    "chunk_gated_delta_rule": lambda gdn, sg, x: gdn.chunk_gated_delta_rule(
        x["q"], x["k"], x["vv"], x["g"], x["beta"], initial_state=x["h0v"], output_final_state=True,
        use_qk_l2norm_in_kernel=True),
    "chunk_gated_delta_rule_v_first": lambda gdn, sg, x: gdn.chunk_gated_delta_rule(
        x["q"], x["k"], x["vv"], x["g"], x["beta"], initial_state=x["h0v"], output_final_state=True,
        use_qk_l2norm_in_kernel=True, state_v_first=True),
    "fused_recurrent_simple_gla": lambda gdn, sg, x: sg.fused_recurrent_simple_gla(
        x["q"], x["k"], x["v"], g_gamma=x["gamma"], initial_state=x["h0"], output_final_state=True),
    "fused_chunk_simple_gla": lambda gdn, sg, x: sg.fused_chunk_simple_gla(
        x["q"], x["k"], x["v"], g=x["g"][..., :H].contiguous(), initial_state=x["h0"], output_final_state=True),
    "parallel_simple_gla": lambda gdn, sg, x: sg.parallel_simple_gla(x["q"], x["k"], x["v"],
                                                                     g=x["g"][..., :H].contiguous()),
}
CULA_CALLS = {
    "chunk_kda": lambda x: _kda_call(cula.chunk_kda, x),
    "fused_recurrent_kda": lambda x: _kda_call(cula.fused_recurrent_kda, x),
    "chunk_kda_v_first": lambda x: _kda_call(cula.chunk_kda, x, state_v_first=True),
    "fused_recurrent_kda_v_first": lambda x: _kda_call(cula.fused_recurrent_kda, x, state_v_first=True),
    "chunk_gated_delta_rule": lambda x: cula.chunk_gated_delta_rule(
        x["q"], x["k"], x["vv"], x["g"], x["beta"], initial_state=x["h0v"], output_final_state=True,
        use_qk_l2norm_in_kernel=True),
    "chunk_gated_delta_rule_v_first": lambda x: cula.chunk_gated_delta_rule(
        x["q"], x["k"], x["vv"], x["g"], x["beta"], initial_state=x["h0v"], output_final_state=True,
        use_qk_l2norm_in_kernel=True, state_v_first=True),
    "fused_recurrent_simple_gla": lambda x: cula.fused_recurrent_simple_gla(
        x["q"], x["k"], x["v"], g_gamma=x["gamma"], initial_state=x["h0"], output_final_state=True),
    "fused_chunk_simple_gla": lambda x: cula.chunk_simple_gla(
        x["q"], x["k"], x["v"], g=x["g"][..., :H].contiguous(), initial_state=x["h0"], output_final_state=True),
    "parallel_simple_gla": lambda x: cula.chunk_simple_gla(x["q"], x["k"], x["v"], g=x["g"][..., :H].contiguous()),
}


@pytest.mark.parametrize("entry", list(FLA_CALLS))
def test_fla_backend(entry, monkeypatch):
    """FLA's entry point gives cula's result bit for bit when cula takes the call; FLA's own when
    FLA_CULA=0 or when an input needs a gradient (the verifier declines), close to cula's. Which one
    ran is told by the calls of cula's ops the backend makes (cula.ops, wrapped here): comparing
    results bit for bit cannot tell, since FLA's chunked simple_gla can match cula's exactly."""
    gdn, sg = _fla_or_skip()
    import cula.ops
    x = inputs()
    with torch.no_grad():
        want = CULA_CALLS[entry](x)
    calls = []
    for name in ("chunk_gated_delta_rule", "chunk_simple_gla", "fused_recurrent_simple_gla", "chunk_kda",
                 "fused_recurrent_kda"):
        real = getattr(cula.ops, name)
        monkeypatch.setattr(cula.ops, name, lambda *a, _f=real, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    with torch.no_grad():
        got = FLA_CALLS[entry](gdn, sg, x)
    assert_same(want, got, f"{entry} through FLA")
    assert calls, f"{entry} through FLA: no call of cula's ops recorded"

    def close_but_not_cula(result, what):
        assert not calls, f"{what}: cula's kernel ran ({calls})"
        for a, b in zip(tensors(want), tensors(result), strict=True):
            err = ((a.float() - b.float()).norm() / a.float().norm()).item()
            assert err < 2e-2, f"{what}: FLA's result differs from cula's by {err:.2e}"

    calls.clear()
    monkeypatch.setenv("FLA_CULA", "0")
    with torch.no_grad():
        close_but_not_cula(FLA_CALLS[entry](gdn, sg, x), "FLA_CULA=0")
    monkeypatch.delenv("FLA_CULA")
    x["q"].requires_grad_(True)
    result = FLA_CALLS[entry](gdn, sg, x)
    close_but_not_cula(tuple(t.detach() if t is not None else None for t in result), "q.requires_grad")
