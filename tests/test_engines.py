"""cula.vllm and cula.sglang: the fused-gating decode call of each engine with that engine's own
arguments (names, order, defaults), so that swapping the import is the whole change. Runs without a
GPU: each call shape passes every check and stops at the device check; options cula does not take
raise NotImplementedError naming them. (tests/gpu/test_engines.py runs them against the reference.)"""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch", reason="the CPU build of torch is installed by tests/run.py on Python 3.11")
cula = pytest.importorskip("cula")

from cula import sglang, vllm  # noqa: E402

DEVICE = r"^cula: q must be on a CUDA device, got a cpu array$"
N, H, HV, D = 3, 2, 4, 64

# The engines' signatures (vLLM's vllm/model_executor/layers/fla/ops/fused_sigmoid_gating.py, SGLang's
# python/sglang/srt/layers/attention/fla/fused_sigmoid_gating_recurrent.py): names in order, defaults.
VLLM = [("A_log", None), ("a", None), ("b", None), ("dt_bias", None), ("q", None), ("k", None), ("v", None),
        ("beta", 1.0), ("threshold", 20.0), ("scale", None), ("initial_state", None), ("inplace_final_state", True),
        ("cu_seqlens", None), ("ssm_state_indices", None), ("num_accepted_tokens", None),
        ("use_qk_l2norm_in_kernel", False), ("is_kda", False)]
SGLANG = [("A_log", None), ("a", None), ("dt_bias", None), ("softplus_beta", None), ("softplus_threshold", None),
          ("q", None), ("k", None), ("v", None), ("b", None), ("initial_state_source", None),
          ("initial_state_indices", None), ("scale", None), ("use_qk_l2norm_in_kernel", False), ("cu_seqlens", None),
          ("is_kda", False), ("disable_state_update", False), ("intermediate_states_buffer", None),
          ("intermediate_state_indices", None), ("cache_steps", None), ("retrieve_parent_token", None),
          ("lower_bound", None)]


# SGLang's decode fast path (python/sglang/srt/layers/attention/fla/fused_recurrent.py), both families
PACKED = [("mixed_qkv", None), ("a", None), ("b", None), ("A_log", None), ("dt_bias", None), ("scale", None),
          ("initial_state", None), ("out", None), ("ssm_state_indices", None), ("use_qk_l2norm_in_kernel", False)]


@pytest.mark.parametrize("fn, want", [(vllm.fused_sigmoid_gating_delta_rule_update, VLLM),
                                      (sglang.fused_sigmoid_gating_delta_rule_update, SGLANG),
                                      (sglang.fused_recurrent_gated_delta_rule_packed_decode, PACKED),
                                      (sglang.fused_recurrent_kda_packed_decode, [*PACKED, ("lower_bound", None)])],
                         ids=["vllm", "sglang", "sglang_packed", "sglang_packed_kda"])
def test_signature(fn, want):
    params = inspect.signature(fn).parameters.values()
    got = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params]
    assert got == want
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    assert required == [name for name, default in want if default is None][:len(required)]


def inputs(per_key=False):
    """SGLang's and vLLM's decode: [1, N, ..] tokens with cu_seqlens, a and b [N, HV] (KDA: a [N, HV * K])."""
    q, k = (torch.randn(1, N, H, D, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(1, N, HV, D, dtype=torch.bfloat16)
    a = torch.randn(N, HV * D if per_key else HV)
    b = torch.randn(N, HV)
    A_log, dt_bias = torch.rand(HV), torch.rand(HV, D) if per_key else torch.rand(HV)
    pool = torch.zeros(8, HV, D, D)  # (value-first: the same shape at K = V)
    return q, k, v, a, b, A_log, dt_bias, pool, torch.tensor([1, -1, 4]), torch.arange(N + 1, dtype=torch.int32)


def raises(exc, pattern, fn, **kw):
    with pytest.raises(exc, match=pattern) as info:
        fn(**kw)
    return str(info.value)


@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_vllm_calls(is_kda):
    q, k, v, a, b, A_log, dt_bias, pool, idx, cu = inputs(is_kda)
    fn = vllm.fused_sigmoid_gating_delta_rule_update
    kw = dict(A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, initial_state=pool, cu_seqlens=cu,
              use_qk_l2norm_in_kernel=True, is_kda=is_kda)
    raises(ValueError, DEVICE, fn, ssm_state_indices=idx, **kw)
    raises(ValueError, DEVICE, fn, ssm_state_indices=idx, inplace_final_state=False, **kw)
    spec = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, -1]])
    raises(ValueError, DEVICE, fn, ssm_state_indices=spec, num_accepted_tokens=torch.tensor([1, 2, 3]), **kw)
    raises(ValueError, r"inplace_final_state=True needs ssm_state_indices", fn, **kw)
    raises(NotImplementedError, r"^cula.vllm.fused_sigmoid_gating_delta_rule_update: only beta=1.0 and "
           r"threshold=20.0 are supported \(cula's in-kernel softplus\), got beta=2.0, threshold=20.0$", fn,
           beta=2.0, ssm_state_indices=idx, **kw)
    raises(ValueError, r"^cula: initial_state must have shape \[N, H, V, K\] = \[P, 4, 64, 64\]", fn,
           ssm_state_indices=idx, **dict(kw, initial_state=pool[:, :2]))


@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_sglang_calls(is_kda):
    q, k, v, a, b, A_log, dt_bias, pool, idx, cu = inputs(is_kda)
    fn = sglang.fused_sigmoid_gating_delta_rule_update
    kw = dict(A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
              initial_state_indices=idx, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
              softplus_threshold=20.0, is_kda=is_kda)
    raises(ValueError, DEVICE, fn, **kw)
    raises(ValueError, DEVICE, fn, disable_state_update=True, **kw)
    raises(ValueError, DEVICE, fn, **dict(kw, initial_state_source=None))
    raises(NotImplementedError, r"softplus_threshold=20.0 are supported \(cula's in-kernel softplus\), got "
           r"softplus_beta=1.0, softplus_threshold=10.0$", fn, **dict(kw, softplus_threshold=10.0))
    # the target verify: the cache [C, steps, HV, V, K] at intermediate_state_indices, a tree
    cache, cidx = torch.zeros(4, 2, HV, D, D), torch.tensor([0, 1, 3], dtype=torch.int32)
    parents = torch.tensor([[-1, 0], [-1, 0], [-1, -1]])
    verify = dict(kw, disable_state_update=True, intermediate_states_buffer=cache, intermediate_state_indices=cidx,
                  cache_steps=2)
    raises(ValueError, DEVICE, fn, **verify)
    raises(ValueError, DEVICE, fn, retrieve_parent_token=parents, **verify)
    raises(ValueError, DEVICE, fn, **dict(verify, cache_steps=None, disable_state_update=False))
    together = r"^cula.sglang.fused_sigmoid_gating_delta_rule_update: the target verify takes intermediate_states"
    raises(ValueError, together, fn, **dict(verify, intermediate_state_indices=None))
    raises(ValueError, together, fn, **dict(verify, initial_state_source=None))
    raises(ValueError, r"retrieve_parent_token needs intermediate_states_buffer", fn, retrieve_parent_token=parents,
           **kw)
    raises(ValueError, r"^cula: cache_steps must be intermediate_states_buffer.shape\[1\] = 2 \(or None\), got 4$",
           fn, **dict(verify, cache_steps=4))
    raises(ValueError, r"^cula: intermediate_states_buffer must have shape \[C, steps, HV, V, K\] = "
           r"\[C, steps, 4, 64, 64\], got \[4, 2, 2, 64, 64\]$", fn,
           **dict(verify, intermediate_states_buffer=cache[:, :, :2]))
    raises(TypeError, r"^cula: intermediate_states_buffer must be float32, got float64$", fn,
           **dict(verify, intermediate_states_buffer=cache.double()))
    raises(ValueError, r"^cula: intermediate_states_buffer is written in place, so it must be contiguous", fn,
           **dict(verify, intermediate_states_buffer=cache.transpose(-1, -2)))
    raises(ValueError, r"^cula: intermediate_state_indices must have shape \[N\] = \[3\], got \[2\]$", fn,
           **dict(verify, intermediate_state_indices=cidx[:2]))
    raises(ValueError, r"^cula: intermediate_state_indices must lie in \[-1, 4\) \(-1 = padding\), got "
           r"intermediate_state_indices\[2\]=4$", fn, **dict(verify, intermediate_state_indices=cidx + 1))
    raises(ValueError, r"^cula: retrieve_parent_token must have shape \[N, S\] = \[3, S\], got \[3\]$", fn,
           retrieve_parent_token=parents[:, 0], **verify)
    raises(TypeError, r"^cula: retrieve_parent_token must be int32 or int64, got float32$", fn,
           retrieve_parent_token=parents.float(), **verify)
    raises(ValueError, r"^cula: retrieve_parent_token\[1, 1\] must name an earlier token \(< 1\), got 1$", fn,
           retrieve_parent_token=torch.tensor([[-1, 0], [-1, 1], [0, 0]]), **verify)
    if is_kda:
        raises(ValueError, DEVICE, fn, lower_bound=-5.0, **kw)
        raises(ValueError, DEVICE, fn, lower_bound=-5.0, **dict(verify, retrieve_parent_token=parents))
    else:
        raises(ValueError, r"^cula.sglang.fused_sigmoid_gating_delta_rule_update: lower_bound is KDA's bounded gate; "
               r"it needs is_kda=True$", fn, lower_bound=-5.0, **kw)
    raises(ValueError, r"^cula: initial_state_indices must have shape \[N\] = \[3\] or \[N, S\], got \[2\]$", fn,
           **dict(kw, initial_state_indices=idx[:2]))
    raises(ValueError, r"^cula: b must have shape \[B, T, HV\] = \[1, 3, 4\], got \[3, 3\]$", fn,
           **dict(kw, b=b[:, :3]))
    raises(TypeError, r"^cula: a must be float32, bfloat16 or float16, got int64$", fn, **dict(kw, a=a.long()))


@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_sglang_packed_decode(is_kda):
    """SGLang's packed decode: q, k, v as views of mixed_qkv [B, 2 H K + HV V], o into out [B, 1, HV, V]."""
    fn = (sglang.fused_recurrent_kda_packed_decode if is_kda
          else sglang.fused_recurrent_gated_delta_rule_packed_decode)
    name = fn.__name__
    mixed = torch.randn(N, 2 * H * D + HV * D, dtype=torch.bfloat16)
    a = torch.randn(N, HV * D if is_kda else HV)
    b, A_log = torch.randn(N, HV), torch.rand(HV)
    dt_bias = torch.rand(HV * D if is_kda else HV)
    pool, idx = torch.zeros(8, HV, D, D), torch.tensor([1, -1, 4])
    out = torch.empty(N, 1, HV, D, dtype=torch.bfloat16)
    kw = dict(mixed_qkv=mixed, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=D ** -0.5, initial_state=pool, out=out,
              ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    raises(ValueError, DEVICE, fn, **kw)
    raises(ValueError, rf"^cula.sglang.{name}: mixed_qkv must have shape \[B, 2 H K \+ HV V\] with HV = 4, V = 64, "
           r"K = 64 \(the pool's\), got \[3, 500\]$", fn, **dict(kw, mixed_qkv=mixed[:, :500]))
    raises(ValueError, rf"^cula.sglang.{name}: mixed_qkv must have shape", fn, **dict(kw, mixed_qkv=mixed[None]))
    raises(ValueError, rf"^cula.sglang.{name}: initial_state must be the \[P, HV, V, K\] state pool, got shape "
           r"\[8, 4, 4096\]$", fn, **dict(kw, initial_state=pool.flatten(2)))
    raises(ValueError, r"^cula: out must ", fn, **dict(kw, out=out.transpose(0, 1)))
    raises(ValueError, r"^cula: out must ", fn, **dict(kw, out=out[:2]))
    raises(ValueError, r"^cula: ssm_state_indices must have shape \[N\] = \[3\]", fn,
           **dict(kw, ssm_state_indices=idx[:2]))
    raises(ValueError, r"^cula: b must have shape", fn, **dict(kw, b=b[:, :3]))
    if is_kda:  # (newer SGLang's bounded gate)
        raises(ValueError, DEVICE, fn, lower_bound=-5.0, **kw)
        raises(TypeError, r"^cula: lower_bound must be a float", fn, lower_bound="x", **kw)
