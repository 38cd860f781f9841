"""Bad inputs of the gated delta rule's ops raise a clear exception naming the argument, before
any launch (as tests/test_checks.py does for simple_gla). CPU tensors pass the shape and dtype
checks and stop at the device check, so each case isolates one mistake."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the CPU build of torch is installed by tests/run.py on Python 3.11")
cula = pytest.importorskip("cula")

B, T, H, HV, D = 2, 10, 2, 4, 64
DEVICE = r"^cula: q must be on a CUDA device, got a cpu array$"
IN_PLACE = r"^cula: initial_state is updated in place, so each of its \[4, 64, 64\] states must be contiguous"


def inputs(b=B, t=T, h=H, hv=HV, d=D, dtype=torch.bfloat16):
    q = torch.randn(b, t, h, d, dtype=dtype)
    return q, torch.randn_like(q), torch.randn(b, t, hv, d, dtype=dtype), torch.zeros(b, t, hv), torch.rand(b, t, hv)


def raises(exc, pattern, fn, *args, **kw):
    with pytest.raises(exc, match=pattern) as info:
        fn(*args, **kw)
    return str(info.value)


SEQ_OPS = [cula.chunk_gated_delta_rule, cula.fused_recurrent_gated_delta_rule]


def call(op, q, k, v, g, beta, **kw):
    if op is cula.chunk_gated_delta_rule:
        return op(q, k, v, g, beta, **kw)
    return op(q, k, v, g=g, beta=beta, **kw)


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_valid_calls_stop_at_the_device_check(op):
    q, k, v, g, beta = inputs()
    raises(ValueError, DEVICE, call, op, q, k, v, g, beta, initial_state=torch.zeros(B, HV, D, D),
           output_final_state=True, use_qk_l2norm_in_kernel=True)
    # g and beta in bf16, the in-kernel gate with its per-head parameters, beta as logits
    raises(ValueError, DEVICE, call, op, q, k, v, g.bfloat16(), beta.bfloat16(), use_gate_in_kernel=True,
           A_log=torch.zeros(HV), dt_bias=torch.zeros(HV, dtype=torch.bfloat16), use_beta_sigmoid_in_kernel=True,
           allow_neg_eigval=True)
    cu = torch.tensor([0, 3, 3, 10])
    q1, k1, v1, g1, b1 = inputs(b=1)
    raises(ValueError, DEVICE, call, op, q1, k1, v1, g1, b1, cu_seqlens=cu, initial_state=torch.zeros(3, HV, D, D))


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_shapes_and_dtypes(op):
    q, k, v, g, beta = inputs()
    raises(ValueError, r"^cula: v's heads HV=3 must be a multiple of q's heads H=2", call, op, q, k, v[:, :, :3], g,
           beta)
    raises(ValueError, r"^cula: k must have the shape of q \[2, 10, 2, 64\], got \[2, 10, 1, 64\]$", call, op, q,
           k[:, :, :1], v, g, beta)
    raises(ValueError, r"^cula: head dims K = V in \(64, 128\)", call, op, q[..., :32], k[..., :32], v[..., :32], g,
           beta)
    raises(ValueError, r"^cula: g must have shape \[B, T, HV\] = \[2, 10, 4\], got \[2, 10, 2\]$", call, op, q, k,
           v, g[..., :2], beta)
    raises(ValueError, r"^cula: beta must have shape \[B, T, HV\] = \[2, 10, 4\], got \[2, 9, 4\]$", call, op, q,
           k, v, g, beta[:, :9])
    raises(TypeError, r"^cula: beta must be float32, bfloat16 or float16, got float64$", call, op, q, k, v, g,
           beta.double())
    raises(NotImplementedError, r"per-value-column beta", call, op, q, k, v, g, torch.rand(B, T, HV, D))
    raises(ValueError, r"^cula: initial_state must have shape \[N, H, K, V\] = \[2, 4, 64, 64\], got \[2, 2, 64, 64\]",
           call, op, q, k, v, g, beta, initial_state=torch.zeros(B, H, D, D))
    raises(TypeError, r"^cula: q must be bfloat16 or float16, got float32$", call, op, q.float(), k, v, g, beta)


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_options(op):
    q, k, v, g, beta = inputs()
    raises(ValueError, r"A_log \(\[HV\]\) must be given when use_gate_in_kernel=True", call, op, q, k, v, g, beta,
           use_gate_in_kernel=True)
    raises(ValueError, r"^cula: A_log must have shape \[HV\] = \[4\], got \[2\]$", call, op, q, k, v, g, beta,
           use_gate_in_kernel=True, A_log=torch.zeros(2))
    raises(TypeError, r"^cula: dt_bias must be float32, bfloat16 or float16, got int32$", call, op, q, k, v, g,
           beta, use_gate_in_kernel=True, A_log=torch.zeros(HV), dt_bias=torch.zeros(HV, dtype=torch.int32))
    raises(ValueError, r"allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True", call, op, q, k, v, g,
           beta, allow_neg_eigval=True)
    raises(TypeError, r"^cula: use_qk_l2norm_in_kernel must be a bool, got int$", call, op, q, k, v, g, beta,
           use_qk_l2norm_in_kernel=1)
    # value-first states ([N, HV, V, K]) are taken, also by FLA's deprecated name for the option
    raises(ValueError, DEVICE, call, op, q, k, v, g, beta, state_v_first=True, initial_state=torch.zeros(B, HV, D, D))
    with pytest.warns(DeprecationWarning, match="transpose_state_layout is deprecated"):
        raises(ValueError, DEVICE, call, op, q, k, v, g, beta, transpose_state_layout=True)
    raises(ValueError, r"cannot pass both state_v_first and the deprecated transpose_state_layout", call, op, q, k,
           v, g, beta, state_v_first=True, transpose_state_layout=True)
    raises(TypeError, r"state_v_first must be a bool, got int", call, op, q, k, v, g, beta, state_v_first=1)
    raises(ValueError, r"^cula: initial_state must have shape \[N, H, V, K\] = \[2, 4, 64, 64\], got \[2, 2, 64, 64\]",
           call, op, q, k, v, g, beta, state_v_first=True, initial_state=torch.zeros(B, H, D, D))
    raises(TypeError, r"unexpected keyword argument\(s\): bogus$", call, op, q, k, v, g, beta, bogus=1)
    # vLLM's and SGLang's calls pass head_first=False; True is refused as FLA refuses it
    raises(ValueError, DEVICE, call, op, q, k, v, g, beta, head_first=False)
    raises(DeprecationWarning, r"head_first has been removed", call, op, q, k, v, g, beta, head_first=True)


def test_fla_only_options():
    q, k, v, g, beta = inputs()
    raises(ValueError, r"chunk_size must be 16, 32 or 64 for the gated delta rule, got 128",
           cula.chunk_gated_delta_rule, q, k, v, g, beta, chunk_size=128)
    raises(ValueError, DEVICE, cula.chunk_gated_delta_rule, q, k, v, g, beta, chunk_size=32, chunk_indices=None)
    raises(NotImplementedError, r"context parallelism \(cp_context\) is not supported", cula.chunk_gated_delta_rule,
           q, k, v, g, beta, cp_context=object())
    raises(NotImplementedError, r"per-key \(gk\) and per-value \(gv\) gates are not supported",
           cula.fused_recurrent_gated_delta_rule, q, k, v, gk=torch.zeros(B, T, HV, D), beta=beta)


def test_vllm_serving_keywords():
    """fused_recurrent_gated_delta_rule with vLLM's keywords: the pool, its slots, accepted tokens."""
    op = cula.fused_recurrent_gated_delta_rule
    q, k, v, g, beta = inputs(b=1)
    pool = torch.zeros(8, HV, D, D)
    cu = torch.tensor([0, 4, 7, 10])
    idx = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [-1, -1, -1, -1]], dtype=torch.int32)
    acc = torch.tensor([1, 2, 1], dtype=torch.int32)
    raises(ValueError, DEVICE, op, q, k, v, g=g, beta=beta, initial_state=pool, inplace_final_state=True,
           cu_seqlens=cu, ssm_state_indices=idx, num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True)
    raises(ValueError, r"ssm_state_indices must lie in \[-1, 8\) \(-1 = padding\), got ssm_state_indices\[1, 2\]=8",
           op, q, k, v, g=g, beta=beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx + (idx == 6).int() * 2)
    raises(ValueError, r"num_accepted_tokens must lie in \[-1, 5\)", op, q, k, v, g=g, beta=beta, initial_state=pool,
           cu_seqlens=cu, ssm_state_indices=idx, num_accepted_tokens=acc * 5)
    raises(ValueError, r"num_accepted_tokens needs ssm_state_indices of shape \[N, S\]", op, q, k, v, g=g, beta=beta,
           initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx[:, 0], num_accepted_tokens=acc)
    raises(ValueError, r"ssm_state_indices needs initial_state", op, q, k, v, g=g, beta=beta, cu_seqlens=cu,
           ssm_state_indices=idx)
    raises(ValueError, r"inplace_final_state=True needs ssm_state_indices", op, q, k, v, g=g, beta=beta,
           initial_state=pool[:3], cu_seqlens=cu, inplace_final_state=True)
    raises(ValueError, r"output_final_state must be False", op, q, k, v, g=g, beta=beta, initial_state=pool,
           cu_seqlens=cu, ssm_state_indices=idx, output_final_state=True)
    raises(ValueError, IN_PLACE, op, q, k, v, g=g, beta=beta, initial_state=pool.transpose(2, 3), cu_seqlens=cu,
           ssm_state_indices=idx)
    # EAGLE trees: each token from its parent's state, kept per token (its slot, or the per-token states)
    tree = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 1], [-1, 0, 0, 0]])
    for in_place in (True, False):
        raises(ValueError, DEVICE, op, q, k, v, g=g, beta=beta, initial_state=pool, inplace_final_state=in_place,
               cu_seqlens=cu, ssm_state_indices=idx, num_accepted_tokens=acc, retrieve_parent_token=tree)
    raises(ValueError, r"^cula.fused_recurrent_gated_delta_rule: retrieve_parent_token needs the state after every "
           r"token kept: ssm_state_indices of shape \[N, S\] or inplace_final_state=False$", op, q, k, v, g=g,
           beta=beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx[:, 0], retrieve_parent_token=tree)
    raises(ValueError, r"retrieve_parent_token needs the state after every token kept", op, q, k, v, g=g, beta=beta,
           initial_state=pool[:3], cu_seqlens=cu, retrieve_parent_token=tree)
    raises(ValueError, r"^cula: retrieve_parent_token\[2, 2\] must name an earlier token \(< 2\), got 2$", op, q, k,
           v, g=g, beta=beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx,
           retrieve_parent_token=tree + torch.tensor([0, 0, 2, 0]) * (torch.arange(3) == 2)[:, None])
    raises(ValueError, r"^cula: retrieve_parent_token must have shape \[N, S\] = \[3, S\], got \[2, 4\]$", op, q, k,
           v, g=g, beta=beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx, retrieve_parent_token=tree[:2])


def pages(slots, front, page, inner=(HV, D, D)):
    """A pool as vLLM's hybrid cache hands it to a layer: `slots` pages of `page` floats, each holding
    (after `front` floats of conv state) one [HV, D, D] state, seen through torch.as_strided."""
    raw = torch.zeros((slots - 1) * page + front + inner[0] * inner[1] * inner[2])
    return torch.as_strided(raw, (slots, *inner), (page, inner[1] * inner[2], inner[2], 1), storage_offset=front)


def test_paged_pools():
    """Pools whose slots lie apart (vLLM's ssm_state) pass every pool op's checks (they then fail on
    the CPU only for the device); slots that are not contiguous, not 16-byte aligned or overlapping
    are refused where the pool is written in place, with the strides in the message."""
    q, k, v, g, beta = inputs(b=1)
    cu = torch.tensor([0, 4, 7, 10])
    size = HV * D * D
    paged = pages(8, 3 * 64 + 4, size + 3 * 64 + 4 + 12)
    assert not paged.is_contiguous()
    idx = torch.tensor([5, -1, 0], dtype=torch.int32)
    kw = dict(cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    raises(ValueError, DEVICE, cula.fused_recurrent_gated_delta_rule, q, k, v, g=g, beta=beta, initial_state=paged,
           ssm_state_indices=idx, inplace_final_state=True, **kw)
    raises(ValueError, DEVICE, cula.fused_recurrent_gated_delta_rule, q, k, v, g=g, beta=beta, initial_state=paged,
           ssm_state_indices=idx, inplace_final_state=False, **kw)
    raises(ValueError, DEVICE, cula.chunk_gated_delta_rule, q, k, v, g, beta, initial_state=paged,
           initial_state_indices=idx, **kw)
    raises(ValueError, DEVICE, cula.chunk_kda, q, k, v, torch.zeros(1, T, HV, D), beta, initial_state=paged,
           initial_state_indices=idx, **kw)
    n = 3
    dq, dk, dv, dg, db = (x[0, :n] for x in (q, k, v, g, beta))
    raises(ValueError, DEVICE, cula.gated_delta_rule_decode, dq, dk, dv, dg, db, paged, state_indices=idx)
    raises(ValueError, DEVICE, cula.kda_decode, dq, dk, dv, torch.zeros(n, HV, D), db, paged, state_indices=idx)
    raises(ValueError, DEVICE, cula.simple_gla_decode, dq, dk, dk, paged[:, :H], state_indices=idx,
           g_gamma=torch.zeros(H))
    raises(ValueError, DEVICE, cula.gated_delta_rule_decode, dq, dk, dv, dg, db, paged[:n])  # ([N, ..] without slots)
    bad = {"a slot pitch of 2 floats past its state (8 bytes)": pages(8, 0, size + 2),
           "8-byte aligned slots": pages(8, 2, size + 4),
           "overlapping slots": pages(8, 0, size - 4),
           "transposed states": paged.transpose(2, 3)}
    for what, pool in bad.items():
        strides = ", ".join(map(str, pool.stride()))
        msg = raises(ValueError, IN_PLACE.replace("initial_state", "state"), cula.gated_delta_rule_decode, dq, dk,
                     dv, dg, db, pool, state_indices=idx)
        assert msg.endswith(f"got strides ({strides})"), (what, msg)
        raises(ValueError, IN_PLACE, cula.chunk_gated_delta_rule, q, k, v, g, beta, initial_state=pool,
               initial_state_indices=idx, **kw)
        raises(ValueError, DEVICE, cula.chunk_gated_delta_rule, q, k, v, g, beta, initial_state=pool,
               initial_state_indices=idx, inplace_update=False, **kw)  # (only read: copied)


def test_values_unchecked(monkeypatch):
    """CULA_CHECK_VALUES=0: the values of cu_seqlens and of the slots are not read (no device-to-host
    copy); calls with values out of range get past every check (to the device check, on the CPU),
    as during CUDA-graph capture. Their shapes and dtypes are still checked."""
    q, k, v, g, beta = inputs(b=1)
    pool = torch.zeros(8, HV, D, D)
    bad_cu = torch.tensor([0, 7, 4, 10])  # (decreasing)
    idx = torch.tensor([5, 9, 0], dtype=torch.int32)  # (9: out of the pool)
    n = 3
    dq, dk, dv, dg, db = (x[0, :n] for x in (q, k, v, g, beta))
    calls = [
        (r"must be non-decreasing", dict(fn=cula.fused_recurrent_gated_delta_rule, q=q, k=k, v=v, g=g, beta=beta,
                                         initial_state=pool, cu_seqlens=bad_cu, ssm_state_indices=idx[[0, 2, 2]])),
        (r"ssm_state_indices must lie in", dict(fn=cula.fused_recurrent_gated_delta_rule, q=q, k=k, v=v, g=g,
                                                beta=beta, initial_state=pool, cu_seqlens=torch.tensor([0, 4, 7, 10]),
                                                ssm_state_indices=idx)),
        (r"initial_state_indices must lie in", dict(fn=cula.chunk_gated_delta_rule, q=q, k=k, v=v, g=g, beta=beta,
                                                    initial_state=pool, cu_seqlens=torch.tensor([0, 4, 7, 10]),
                                                    initial_state_indices=idx)),
        (r"state_indices must lie in", dict(fn=cula.gated_delta_rule_decode, q=dq, k=dk, v=dv, g=dg, beta=db,
                                            state=pool, state_indices=idx)),
        (r"state_indices must lie in", dict(fn=cula.simple_gla_decode, q=dq, k=dk, v=dk, state=pool[:, :H],
                                            state_indices=idx)),
        # (the per-head decay's sequence ops, whose kernels clamp cu_seqlens too; Lightning runs them)
        (r"must be non-decreasing", dict(fn=cula.chunk_simple_gla, q=q, k=k, v=k, g_gamma=torch.zeros(H),
                                         cu_seqlens=bad_cu)),
        (r"must be non-decreasing", dict(fn=cula.fused_recurrent_simple_gla, q=q, k=k, v=k, g_gamma=torch.zeros(H),
                                         cu_seqlens=bad_cu)),
        (r"must be non-decreasing", dict(fn=cula.chunk_lightning_attn, q=q, k=k, v=k, layer_idx=1, num_layers=4,
                                         cu_seqlens=bad_cu)),
    ]
    for setting, want in (("1", None), ("0", DEVICE), (" Off ", DEVICE)):
        monkeypatch.setenv("CULA_CHECK_VALUES", setting)
        for message, call in calls:
            call = dict(call)
            fn = call.pop("fn")
            raises(ValueError, want or message, fn, **call)
    raises(TypeError, r"state_indices must be int32 or int64", cula.gated_delta_rule_decode, dq, dk, dv, dg, db,
           pool, state_indices=idx.float())


@pytest.mark.parametrize("op", [cula.chunk_gated_delta_rule, cula.chunk_kda], ids=lambda f: f.__name__)
def test_sglang_extend_keywords(op):
    """The chunk ops with SGLang's keywords: the pool (value-first, as SGLang keeps it, or key-first),
    its slots (initial_state_indices), the final states back to it (inplace_update) or not."""
    q, k, v, g, beta = inputs(b=1)
    if op is cula.chunk_kda:
        g = torch.zeros(1, T, HV, D)
    pool = torch.zeros(8, HV, D, D)
    cu = torch.tensor([0, 4, 7, 10])
    idx = torch.tensor([5, -1, 0], dtype=torch.int64)
    kw = dict(cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    raises(ValueError, DEVICE, op, q, k, v, g, beta, initial_state=pool, initial_state_indices=idx,
           inplace_update=True, head_first=False, state_v_first=True, **kw)
    raises(ValueError, DEVICE, op, q, k, v, g, beta, initial_state=pool, initial_state_indices=idx.int(),
           inplace_update=False, output_final_state=True, **kw)
    raises(ValueError, r"^cula: initial_state_indices must lie in \[-1, 8\) \(-1 = padding\), got "
           r"initial_state_indices\[0\]=8$", op, q, k, v, g, beta, initial_state=pool, initial_state_indices=idx + 3,
           **kw)
    raises(ValueError, r"^cula: initial_state_indices must have shape \[N\] = \[3\], got \[3, 1\]$", op, q, k, v, g,
           beta, initial_state=pool, initial_state_indices=idx[:, None], **kw)
    raises(TypeError, r"^cula: initial_state_indices must be int32 or int64, got float32$", op, q, k, v, g, beta,
           initial_state=pool, initial_state_indices=idx.float(), **kw)
    raises(ValueError, r"^cula: initial_state must have shape \[N, H, V, K\] = \[P, 4, 64, 64\], got "
           r"\[8, 2, 64, 64\]$", op, q, k, v, g, beta, initial_state=pool[:, :H], initial_state_indices=idx,
           state_v_first=True, **kw)
    raises(ValueError, IN_PLACE, op, q, k, v, g, beta, initial_state=pool.transpose(2, 3), initial_state_indices=idx,
           **kw)
    raises(ValueError, DEVICE, op, q, k, v, g, beta, initial_state=pool.transpose(2, 3), initial_state_indices=idx,
           inplace_update=False, **kw)  # (a pool only read may be strided: it is copied)
    raises(ValueError, r"output_final_state must be False \(inplace_update=False returns them", op, q, k, v, g,
           beta, initial_state=pool, initial_state_indices=idx, output_final_state=True, **kw)
    raises(ValueError, r"initial_state_indices needs initial_state, the \[P, HV, K, V\] state pool", op, q, k, v, g,
           beta, initial_state_indices=idx, **kw)
    raises(ValueError, r"inplace_update=True needs initial_state_indices \(the pool slots\)", op, q, k, v, g, beta,
           initial_state=pool[:3], inplace_update=True, **kw)
    raises(TypeError, r"^cula: inplace_update must be a bool, got int$", op, q, k, v, g, beta, initial_state=pool,
           initial_state_indices=idx, inplace_update=1, **kw)
    raises(ValueError, DEVICE, op, q, k, v, g, beta, initial_state=pool[:3], inplace_update=False, **kw)


def test_decode_arguments():
    op = cula.gated_delta_rule_decode
    n, t = 3, 2
    q, k, v, g, beta = inputs(b=n, t=t)
    pool = torch.zeros(6, HV, D, D)
    idx = torch.tensor([[0, 1], [2, 3], [-1, -1]])
    acc = torch.tensor([1, 2, 1])
    raises(ValueError, DEVICE, op, q, k, v, g, beta, pool, state_indices=idx, num_accepted_tokens=acc)
    raises(ValueError, DEVICE, op, q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], pool, state_indices=idx[:, 0])
    raises(ValueError, DEVICE, op, q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], pool[:n])
    raises(ValueError, r"state_indices \[N, S\] needs a slot per token \(S >= T=2\), got S=1", op, q, k, v, g, beta,
           pool, state_indices=idx[:, :1])
    raises(ValueError, r"^cula: g must have shape \[N, T, HV\] = \[3, 2, 4\], got \[3, 4\]$", op, q, k, v, g[:, 0],
           beta, pool, state_indices=idx)
    raises(ValueError, r"^cula: state must have shape \[N, H, K, V\] = \[3, 4, 64, 64\]", op, q, k, v, g, beta, pool)
    raises(ValueError, DEVICE, op, q, k, v, g, beta, pool, state_indices=idx, state_v_first=True)  # SGLang's pools
    raises(ValueError, r"^cula: state must have shape \[N, H, V, K\] = \[3, 4, 64, 64\]", op, q, k, v, g, beta, pool,
           state_v_first=True)
    raises(TypeError, r"^cula: state_v_first must be a bool, got NoneType$", op, q, k, v, g, beta, pool,
           state_indices=idx, state_v_first=None)
    raises(ValueError, r"state_indices must lie in \[-1, 6\)", op, q, k, v, g, beta, pool, state_indices=idx * 3)
    raises(ValueError, r"num_accepted_tokens needs state_indices of shape \[N, S\]", op, q, k, v, g, beta,
           pool[:n], num_accepted_tokens=acc)
    raises(ValueError, r"^cula: out must have the shape of v", op, q, k, v, g, beta, pool, state_indices=idx,
           out=torch.empty(n, HV, D, dtype=torch.bfloat16))
    raises(TypeError, r"state is required", op, q, k, v, g, beta, None)
    raises(ValueError, r"q must have shape \[N, H, K\] or \[N, T, H, K\]", op, q[0, 0], k, v, g, beta, pool)
    # simple_gla's decode takes a per-token g too, in place of g_gamma
    raises(ValueError, DEVICE, cula.simple_gla_decode, q[:, 0], k[:, 0], q[:, 0], pool[:n, :H].contiguous(),
           g=g[:, 0, :H])
