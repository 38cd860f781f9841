"""cula.vllm and cula.sglang on a real GPU: each engine's fused-gating decode call, with its own
arguments, against the float64 reference of what the engine's kernel computes (g = -exp(A_log)
softplus(a + dt_bias), beta = sigmoid(b), q and k L2-normalised, value-first state pools read and
written at the slots; KDA's per-key gate with is_kda): o and the pool's slots within the suite's
tolerance, padding sequences' o zero, the other slots (and the rest of vLLM's pages) untouched."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import test_gated_delta_rule as gdn  # noqa: E402
from cula import sglang, vllm  # noqa: E402
from cula._reference import gated_delta_rule_reference  # noqa: E402
from test_ops_gpu import cu_seqlens_of  # noqa: E402
from test_paged_pools import gaps_untouched, paged  # noqa: E402
from test_state_layout import t  # noqa: E402

H, HV, D, POOL = 2, 4, 128, 12


def case(lengths, is_kda, seed=0):
    """Varlen tokens [1, T, ..], the raw gates a [T, HV] (KDA: [T, HV, K]) and b [T, HV], A_log,
    dt_bias, cu_seqlens, a value-first pool."""
    g_ = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=g_)  # noqa: E731
    total = sum(lengths)
    q, k = (rnd(1, total, H, D).to(torch.bfloat16) for _ in range(2))
    v = rnd(1, total, HV, D).to(torch.bfloat16)
    a = rnd(total, HV, D) if is_kda else rnd(total, HV)
    b = rnd(total, HV)
    A_log = torch.rand(HV, device="cuda", generator=g_) - 2.0
    dt_bias = rnd(HV, D) * 0.5 if is_kda else rnd(HV) * 0.5
    pool = rnd(POOL, HV, D, D) * 0.1
    return q, k, v, a, b, A_log, dt_bias, cu_seqlens_of(lengths, torch.int32), pool


def reference(q, k, v, a, b, A_log, dt_bias, cu, starts, token_states=False):
    """The engines' math in float64 from key-first start states `starts` [N, HV, K, V]."""
    return gated_delta_rule_reference(q, k, v, a.unsqueeze(0), b.unsqueeze(0), None, starts, cu, l2norm=True,
                                      A_log=A_log, dt_bias=dt_bias, beta_sigmoid=True, gate_in_kernel=True,
                                      token_states=token_states)


def check_decode(inputs, pool, slots, o, after):
    """A decode step of one token per sequence from the pool's slots (-1: padding) against the
    reference: o, the states in the slots of `after` (the pool after the call), the other slots."""
    starts = torch.stack([t(pool[s]) if s >= 0 else torch.zeros_like(pool[0]) for s in slots])
    o_ref, h_ref = reference(*inputs, starts)
    live = [n for n, s in enumerate(slots) if s >= 0]
    gdn.check(o_ref[0, live], o[0, live], "o")
    assert torch.count_nonzero(o[0, slots.index(-1)]) == 0, "a padding sequence's o is not zero"
    gdn.check(h_ref[live], t(after[[slots[n] for n in live]]), "the states in the pool")
    others = [s for s in range(POOL) if s not in slots]
    assert torch.equal(after[others], pool[others]), "other slots written"


@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_vllm_decode(is_kda):
    """vLLM's decode on its paged value-first pool: one token per sequence, [N] slots, in place."""
    lengths, slots = [1] * 5, [5, 0, -1, 3, 6]
    q, k, v, a, b, A_log, dt_bias, cu, pool = case(lengths, is_kda)
    view, pages = paged(pool)
    idx = torch.tensor(slots, device="cuda", dtype=torch.int32)
    o, final = vllm.fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, initial_state=view, inplace_final_state=True,
        cu_seqlens=cu, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True, is_kda=is_kda)
    torch.cuda.synchronize()
    assert final is view and gaps_untouched(view, pages)
    check_decode((q, k, v, a, b, A_log, dt_bias, cu), pool, slots, o, view)


@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "per_token"])
def test_vllm_speculative(is_kda, in_place):
    """Three draft tokens a sequence: the start from the accepted prefix's slot, then one state per
    token to its slot (in place) or returned ([T, HV, V, K])."""
    lengths = [3, 3, 3]
    slots = [[0, 1, 2, 3], [4, 5, -1, 6], [7, 8, 9, 10]]
    acc = [2, 1, 3]
    q, k, v, a, b, A_log, dt_bias, cu, pool = case(lengths, is_kda, seed=1)
    view, pages = paged(pool)
    idx = torch.tensor(slots, device="cuda", dtype=torch.int64)
    o, states = vllm.fused_sigmoid_gating_delta_rule_update(
        A_log, a, b, dt_bias, q, k, v, initial_state=view, inplace_final_state=in_place, cu_seqlens=cu,
        ssm_state_indices=idx, num_accepted_tokens=torch.tensor(acc, device="cuda"), use_qk_l2norm_in_kernel=True,
        is_kda=is_kda)
    torch.cuda.synchronize()
    assert gaps_untouched(view, pages)
    starts = torch.stack([t(pool[row[n - 1]]) for row, n in zip(slots, acc, strict=True)])
    o_ref, _, per_token = reference(q, k, v, a, b, A_log, dt_bias, cu, starts, token_states=True)
    gdn.check(o_ref, o, "o")
    written = [(3 * n + i, s) for n, row in enumerate(slots) for i, s in enumerate(row[:3]) if s >= 0]
    if in_place:
        assert states is view
        gdn.check(per_token[[r for r, _ in written]], t(view[[s for _, s in written]]), "the states in the pool")
        kept = [s for s in range(POOL) if s not in [s for _, s in written]]
        assert torch.equal(view[kept], pool[kept]), "other slots written"
    else:
        assert torch.equal(view, pool), "the pool was written"
        gdn.check(per_token, t(states), "the per-token states")


@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_sglang_decode(is_kda):
    """SGLang's decode: [1, N, ..] tokens, a and b [N, HV] (KDA's a flat, [N, HV * K]), its contiguous
    value-first pool written in place; disable_state_update gives the same o and leaves the pool."""
    lengths, slots = [1] * 5, [5, 0, -1, 3, 6]
    q, k, v, a, b, A_log, dt_bias, cu, pool = case(lengths, is_kda, seed=2)
    idx = torch.tensor(slots, device="cuda", dtype=torch.int64)
    kw = dict(A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a.flatten(1) if is_kda else a, b=b,
              initial_state_indices=idx, cu_seqlens=cu.long(), use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
              softplus_threshold=20.0, is_kda=is_kda)
    read_only = pool.clone()
    o_read = sglang.fused_sigmoid_gating_delta_rule_update(initial_state_source=read_only, disable_state_update=True,
                                                          **kw)
    written = pool.clone()
    o = sglang.fused_sigmoid_gating_delta_rule_update(initial_state_source=written, **kw)
    torch.cuda.synchronize()
    assert torch.equal(read_only, pool), "disable_state_update wrote the pool"
    assert torch.equal(o_read, o), "disable_state_update changed o"
    check_decode((q, k, v, a, b, A_log, dt_bias, cu), pool, slots, o, written)


def test_values_unchecked(monkeypatch):
    """CULA_CHECK_VALUES=0 (serving loops outside CUDA graphs): no host check of the slots' values;
    a slot out of the pool is then padding in the kernel, as a -1: the same o and pool bit for bit."""
    lengths = [1] * 5
    q, k, v, a, b, A_log, dt_bias, cu, pool = case(lengths, False, seed=3)
    kw = dict(A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    want_pool, got_pool = pool.clone(), pool.clone()
    want, _ = vllm.fused_sigmoid_gating_delta_rule_update(
        initial_state=want_pool, ssm_state_indices=torch.tensor([5, 0, -1, 3, 6], device="cuda"), **kw)
    outside = torch.tensor([5, 0, POOL + 7, 3, 6], device="cuda")
    with pytest.raises(ValueError, match=r"ssm_state_indices must lie in \[-1, 12\)"):
        vllm.fused_sigmoid_gating_delta_rule_update(initial_state=got_pool, ssm_state_indices=outside, **kw)
    monkeypatch.setenv("CULA_CHECK_VALUES", "0")
    got, _ = vllm.fused_sigmoid_gating_delta_rule_update(initial_state=got_pool, ssm_state_indices=outside, **kw)
    torch.cuda.synchronize()
    assert torch.equal(want, got) and torch.equal(want_pool, got_pool)
