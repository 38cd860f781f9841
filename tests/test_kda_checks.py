"""Bad inputs of KDA's ops (cula.kda) raise a clear exception naming the argument, before any
launch. CPU tensors pass the shape and dtype checks and stop at the device check, so each case
isolates one mistake; the checks KDA shares with the gated delta rule (shapes of q, k, v, states,
pools, indices) are tests/test_gated_delta_rule_checks.py's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the CPU build of torch is installed by tests/run.py on Python 3.11")
cula = pytest.importorskip("cula")

from test_gated_delta_rule_checks import DEVICE, raises  # noqa: E402  (the gated delta rule's helpers)

B, T, H, HV, D = 2, 10, 2, 4, 64


def inputs(b=B, t=T, h=H, hv=HV, d=D, dtype=torch.bfloat16):
    q = torch.randn(b, t, h, d, dtype=dtype)
    return (q, torch.randn_like(q), torch.randn(b, t, hv, d, dtype=dtype), torch.zeros(b, t, hv, d),
            torch.rand(b, t, hv))


SEQ_OPS = [cula.chunk_kda, cula.fused_recurrent_kda]
GATE = dict(use_gate_in_kernel=True, A_log=torch.zeros(HV), dt_bias=torch.zeros(HV * D))


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_valid_calls_stop_at_the_device_check(op):
    q, k, v, g, beta = inputs()
    raises(ValueError, DEVICE, op, q, k, v, g, beta, initial_state=torch.zeros(B, HV, D, D), output_final_state=True,
           use_qk_l2norm_in_kernel=True)
    raises(ValueError, DEVICE, op, q, k, v, g.bfloat16(), beta.half(), **GATE, use_beta_sigmoid_in_kernel=True,
           allow_neg_eigval=True)
    # dt_bias as [HV, K]; the lower-bound gate, with or without A_log
    raises(ValueError, DEVICE, op, q, k, v, g, beta, use_gate_in_kernel=True, A_log=torch.zeros(HV),
           dt_bias=torch.zeros(HV, D), lower_bound=-5.0)
    raises(ValueError, DEVICE, op, q, k, v, g, beta, use_gate_in_kernel=True, lower_bound=-1)
    q1, k1, v1, g1, b1 = inputs(b=1)
    raises(ValueError, DEVICE, op, q1, k1, v1, g1, b1, cu_seqlens=torch.tensor([0, 3, 3, 10]),
           initial_state=torch.zeros(3, HV, D, D))


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_gates(op):
    q, k, v, g, beta = inputs()
    raises(ValueError, r"^cula: g must have shape \[B, T, HV, K\] = \[2, 10, 4, 64\], got \[2, 10, 4\]$", op, q, k, v,
           g[..., 0], beta)
    raises(TypeError, r"^cula: g must be float32, bfloat16 or float16, got float64$", op, q, k, v, g.double(), beta)
    raises(NotImplementedError, r"per-value-column beta", op, q, k, v, g, torch.rand(B, T, HV, D))
    raises(ValueError, r"A_log \(\[HV\]\) must be given when use_gate_in_kernel=True \(or lower_bound set\)", op, q,
           k, v, g, beta, use_gate_in_kernel=True)
    raises(ValueError, r"^cula: dt_bias must have shape \[HV \* K\] = \[256\] or \[HV, K\] = \[4, 64\], got \[4\]$",
           op, q, k, v, g, beta, use_gate_in_kernel=True, A_log=torch.zeros(HV), dt_bias=torch.zeros(HV))
    raises(TypeError, r"lower_bound must be a float or None, got str", op, q, k, v, g, beta, lower_bound="-5")
    raises(ValueError, r"lower_bound must be finite, got nan", op, q, k, v, g, beta, lower_bound=float("nan"))


def test_chunk_options():
    q, k, v, g, beta = inputs()
    op = cula.chunk_kda
    raises(ValueError, r"lower_bound must be given when safe_gate=True and use_gate_in_kernel=True", op, q, k, v, g,
           beta, safe_gate=True, **GATE)
    raises(ValueError, r"lower_bound must be in the safe range \[-5, 0\), got -6.0", op, q, k, v, g, beta,
           safe_gate=True, lower_bound=-6.0, **GATE)
    raises(ValueError, DEVICE, op, q, k, v, g, beta, safe_gate=True, lower_bound=-5.0, **GATE)
    raises(ValueError, DEVICE, op, q, k, v, g, beta, safe_gate=True)  # bounded gates given by the caller
    raises(ValueError, DEVICE, op, q, k, v, g, beta, chunk_size=32, disable_recompute=True, use_graph=True,
           max_num_seqs=2, head_first=False)
    raises(ValueError, r"chunk_size must be 32 or 64 for KDA, got 16", op, q, k, v, g, beta, chunk_size=16)
    raises(NotImplementedError, r"return_intermediate_states=True", op, q, k, v, g, beta,
           return_intermediate_states=True)
    raises(NotImplementedError, r"cp_context", op, q, k, v, g, beta, cp_context=object())
    raises(ValueError, DEVICE, op, q, k, v, g, beta, state_v_first=True)  # (value-first states: taken)
    raises(TypeError, r"state_v_first must be a bool, got str", op, q, k, v, g, beta, state_v_first="yes")
    raises(TypeError, r"unexpected keyword argument\(s\): bogus$", op, q, k, v, g, beta, bogus=1)
    raises(TypeError, r"safe_gate must be a bool, got int", op, q, k, v, g, beta, safe_gate=1)


def test_vllm_serving_keywords_and_out():
    op = cula.fused_recurrent_kda
    q, k, v, g, beta = inputs(b=1)
    pool = torch.zeros(8, HV, D, D)
    cu = torch.tensor([0, 4, 7, 10])
    idx = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [-1, -1, -1, -1]], dtype=torch.int32)
    acc = torch.tensor([1, 2, 1], dtype=torch.int32)
    raises(ValueError, DEVICE, op, q, k, v, g, beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx,
           num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True, out=torch.empty_like(v))
    raises(ValueError, r"ssm_state_indices must lie in \[-1, 8\)", op, q, k, v, g, beta, initial_state=pool,
           cu_seqlens=cu, ssm_state_indices=idx * 3)
    raises(ValueError, r"^cula: out must have the shape of v \[1, 10, 4, 64\], got \[1, 10, 2, 64\]$", op, q, k, v,
           g, beta, out=torch.empty_like(q))
    raises(TypeError, r"^cula: out must have the dtype of v \(bfloat16\), got float16$", op, q, k, v, g, beta,
           out=torch.empty_like(v, dtype=torch.float16))


def test_decode_arguments():
    op = cula.kda_decode
    n, t = 3, 2
    q, k, v, g, beta = inputs(b=n, t=t)
    pool = torch.zeros(6, HV, D, D)
    idx = torch.tensor([[0, 1], [2, 3], [-1, -1]])
    raises(ValueError, DEVICE, op, q, k, v, g, beta, pool, state_indices=idx,
           num_accepted_tokens=torch.tensor([1, 2, 1]))
    raises(ValueError, DEVICE, op, q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], pool, state_indices=idx[:, 0],
           use_gate_in_kernel=True, lower_bound=-5.0, dt_bias=torch.zeros(HV, D))
    raises(ValueError, r"^cula: g must have shape \[N, HV, K\] = \[3, 4, 64\], got \[3, 4\]$", op, q[:, 0], k[:, 0],
           v[:, 0], g[:, 0, :, 0], beta[:, 0], pool[:n])
    raises(ValueError, r"^cula: g must have shape \[N, T, HV, K\] = \[3, 2, 4, 64\], got \[3, 2, 4, 32\]$", op, q, k,
           v, g[..., :32], beta, pool, state_indices=idx)
    raises(ValueError, r"^cula: state must have shape \[N, H, K, V\] = \[3, 4, 64, 64\]", op, q, k, v, g, beta, pool)
    raises(TypeError, r"lower_bound must be a float or None", op, q, k, v, g, beta, pool, state_indices=idx,
           lower_bound=True)
