"""cula.vllm and cula.sglang on a real GPU: each engine's fused-gating decode call, with its own
arguments, against the float64 reference of what the engine's kernel computes (g = -exp(A_log)
softplus(a + dt_bias), beta = sigmoid(b), q and k L2-normalised, value-first state pools read and
written at the slots; KDA's per-key gate with is_kda): o and the pool's slots within the suite's
tolerance, padding sequences' o zero, the other slots (and the rest of vLLM's pages) untouched.
Speculative verification too: SGLang's target verify (its state cache) and both engines' EAGLE
trees (retrieve_parent_token), against each token's path from the root run by the reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import cula  # noqa: E402
import test_gated_delta_rule as gdn  # noqa: E402
from cula import sglang, vllm  # noqa: E402
from cula._reference import gated_delta_rule_reference  # noqa: E402
from test_ops_gpu import _gpu_work, cu_seqlens_of  # noqa: E402
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


def reference(q, k, v, a, b, A_log, dt_bias, cu, starts, token_states=False, lower_bound=None):
    """The engines' math in float64 from key-first start states `starts` [N, HV, K, V]."""
    return gated_delta_rule_reference(q, k, v, a.unsqueeze(0), b.unsqueeze(0), None, starts, cu, l2norm=True,
                                      A_log=A_log, dt_bias=dt_bias, beta_sigmoid=True, gate_in_kernel=True,
                                      token_states=token_states, lower_bound=lower_bound)


def slot_starts(pool, slots):
    """The key-first start states of sequences reading a value-first pool at `slots` (-1: zeros)."""
    return torch.stack([t(pool[s]) if s >= 0 else torch.zeros_like(pool[0]) for s in slots])


def check_decode(inputs, pool, slots, o, after, lower_bound=None):
    """A decode step of one token per sequence from the pool's slots (-1: padding) against the
    reference: o, the states in the slots of `after` (the pool after the call), the other slots."""
    o_ref, h_ref = reference(*inputs, slot_starts(pool, slots), lower_bound=lower_bound)
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


def tree_paths(lengths, parents, chain=()):
    """Each token's path from its sequence's root, as flat token indices, token by token: token t
    follows parents[n][t] (when in [0, t)) else t - 1; the sequences in `chain` always t - 1."""
    paths, base = [], 0
    for n, length in enumerate(lengths):
        for t_ in range(length):
            path, s = [t_], t_
            while s > 0:
                p = parents[n][s] if n not in chain else -1
                s = p if 0 <= p < s else s - 1
                path.append(s)
            paths.append([base + s for s in reversed(path)])
        base += length
    return paths


def tree_reference(inputs, starts, lengths, parents, chain=()):
    """o [T, HV, V] and the state after every token [T, HV, K, V] of a verify whose tokens follow
    their parents: each token's path run from its sequence's start state, in float64."""
    q, k, v, a, b, A_log, dt_bias, _ = inputs
    paths = tree_paths(lengths, parents, chain)
    idx = torch.tensor([i for p in paths for i in p], device="cuda")
    cu = cu_seqlens_of([len(p) for p in paths], torch.int64)
    seq_of = [n for n, length in enumerate(lengths) for _ in range(length)]
    o, h = reference(q[:, idx], k[:, idx], v[:, idx], a[idx], b[idx], A_log, dt_bias, cu, starts[seq_of])
    return o[0, cu[1:] - 1], h


@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_sglang_verify(is_kda, tree):
    """SGLang's target verify: four draft tokens a sequence from its pool slot (-1: padding), the state
    after each token to the cache at the sequence's cache index (-1: none kept, and a tree then runs as
    a chain), the pool only read; with retrieve_parent_token each token from its parent's state."""
    lengths, slots, cache_slots = [4] * 4, [5, -1, 3, 7], [2, 0, 1, -1]
    parents = [[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 1, 0], [-1, 0, 0, 2]] if tree else None
    q, k, v, a, b, A_log, dt_bias, cu, pool = case(lengths, is_kda, seed=4)
    cache = torch.randn(4, 4, HV, D, D, device="cuda")
    before, pool_before = cache.clone(), pool.clone()
    o = sglang.fused_sigmoid_gating_delta_rule_update(
        A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, pool, torch.tensor(slots, device="cuda"), cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True, is_kda=is_kda, disable_state_update=True, intermediate_states_buffer=cache,
        intermediate_state_indices=torch.tensor(cache_slots, device="cuda", dtype=torch.int32), cache_steps=4,
        retrieve_parent_token=torch.tensor(parents, device="cuda") if tree else None)
    torch.cuda.synchronize()
    assert torch.equal(pool, pool_before), "disable_state_update wrote the pool"
    o_ref, h_ref = tree_reference((q, k, v, a, b, A_log, dt_bias, cu), slot_starts(pool, slots), lengths,
                                  parents or [[]] * 4, chain=(3,) if tree else range(4))
    live = [i for i in range(sum(lengths)) if slots[i // 4] >= 0]
    gdn.check(o_ref[live], o[0, live], "o")
    assert torch.count_nonzero(o[0, 4:8]) == 0, "a padding sequence's o is not zero"
    cached = [(n, c) for n, c in enumerate(cache_slots) if c >= 0 and slots[n] >= 0]
    for n, c in cached:
        gdn.check(h_ref[4 * n:4 * n + 4], t(cache[c]), f"sequence {n}'s cached states")
    untouched = [c for c in range(4) if c not in [c for _, c in cached]]
    assert torch.equal(cache[untouched], before[untouched]), "cache entries of no live sequence written"


def test_sglang_verify_writes_back():
    """disable_state_update=False with the cache: the final state also back to the pool slot."""
    lengths, slots = [3, 2], [4, 9]
    q, k, v, a, b, A_log, dt_bias, cu, pool = case(lengths, False, seed=5)
    start, cache = pool.clone(), torch.zeros(2, 3, HV, D, D, device="cuda")
    sglang.fused_sigmoid_gating_delta_rule_update(
        A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, pool, torch.tensor(slots, device="cuda"), cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True, intermediate_states_buffer=cache,
        intermediate_state_indices=torch.tensor([1, 0], device="cuda"))
    torch.cuda.synchronize()
    _, h_ref = reference(q, k, v, a, b, A_log, dt_bias, cu, torch.stack([t(start[s]) for s in slots]))
    gdn.check(h_ref, t(pool[slots]), "the final states in the pool")
    assert torch.equal(pool[slots[0]], cache[1, 2]) and torch.equal(pool[slots[1]], cache[0, 1])
    assert torch.count_nonzero(cache[0, 2]) == 0, "a cache step past the sequence written"


@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "per_token"])
def test_vllm_tree(is_kda, in_place):
    """vLLM's EAGLE tree verify (its own test's trees: sequences of 4, 3, 5 and 6 tokens, one slot a
    token): each token starts from the state its parent left in its slot (in place) or among the
    per-token states, the first from the accepted prefix's slot."""
    lengths = [4, 3, 5, 6]
    parents = [[-1, 0, 0, 1, -1, -1], [-1, 0, 1, -1, -1, -1], [-1, 0, 0, 1, 1, -1], [-1, 0, 0, 1, 1, 2]]
    slots = [[6 * n + i for i in range(6)] for n in range(4)]
    acc = [2, 1, 1, 2]
    q, k, v, a, b, A_log, dt_bias, cu, _ = case(lengths, is_kda, seed=6)
    pool = torch.randn(24, HV, D, D, device="cuda") * 0.1
    start = pool.clone()
    op = cula.fused_recurrent_kda if is_kda else cula.fused_recurrent_gated_delta_rule
    o, states = op(q=q, k=k, v=v, g=a.unsqueeze(0), beta=b.unsqueeze(0), initial_state=pool,
                   inplace_final_state=in_place, cu_seqlens=cu, use_gate_in_kernel=True, A_log=A_log,
                   dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
                   ssm_state_indices=torch.tensor(slots, device="cuda", dtype=torch.int32),
                   num_accepted_tokens=torch.tensor(acc, device="cuda", dtype=torch.int32),
                   retrieve_parent_token=torch.tensor(parents, device="cuda", dtype=torch.int32),
                   use_qk_l2norm_in_kernel=True, state_v_first=True)
    torch.cuda.synchronize()
    starts = torch.stack([t(start[row[n - 1]]) for row, n in zip(slots, acc, strict=True)])
    o_ref, h_ref = tree_reference((q, k, v, a, b, A_log, dt_bias, cu), starts, lengths, parents)
    gdn.check(o_ref, o[0], "o")
    if in_place:
        written = [row[i] for row, n in zip(slots, lengths, strict=True) for i in range(n)]
        gdn.check(h_ref, t(pool[written]), "the states in the pool")
    else:
        assert torch.equal(pool, start), "the pool was written"
        gdn.check(h_ref, t(states), "the per-token states")



@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_verify_kernels_only_for_a_verify(is_kda):
    """The token loop's _verify kernels (a tree's state reload and the state cache: a loop a quarter
    longer, common/recurrence.cuh) run where a call has a tree and only there; a tree that is a chain
    gives the plain kernel's bits."""
    lengths = [4, 3]
    q, k, v, a, b, A_log, dt_bias, cu, pool = case(lengths, is_kda, seed=8)
    slots = torch.arange(8, device="cuda", dtype=torch.int32).view(2, 4)
    chain = torch.tensor([[-1, 0, 1, 2]] * 2, device="cuda", dtype=torch.int32)
    op = cula.fused_recurrent_kda if is_kda else cula.fused_recurrent_gated_delta_rule

    def run(parents):
        return op(q=q, k=k, v=v, g=a.unsqueeze(0), beta=b.unsqueeze(0), initial_state=pool.clone(),
                  inplace_final_state=True, cu_seqlens=cu, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                  use_beta_sigmoid_in_kernel=True, ssm_state_indices=slots, retrieve_parent_token=parents,
                  num_accepted_tokens=torch.ones(2, device="cuda", dtype=torch.int32), use_qk_l2norm_in_kernel=True,
                  state_v_first=True)[0]

    family = "cula_kda_recurrent_" if is_kda else "cula_gdn_recurrent_"
    for parents, suffix in ((None, "_vfirst"), (chain, "_vfirst_verify")):
        loops = [n for n in _gpu_work(lambda: run(parents)) if n.startswith(family)]  # noqa: B023
        assert len(loops) == 1 and loops[0].endswith("_d128" + suffix), loops
    assert torch.equal(run(None), run(chain)), "a chain's tree differs from the plain token loop"


@pytest.mark.parametrize("family", ["gdn", "kda", "simple_gla"])
@pytest.mark.parametrize("v_first", [False, True], ids=["key_first", "value_first"])
@pytest.mark.parametrize("dim", [64, 128])
def test_one_token_kernels(family, v_first, dim, monkeypatch):
    """Sequences of one token each (a decode step) run the token loop's _one kernels at K = 64 (8
    CTAs an SM, common/recurrence.cuh) and the loop kernels at 128: fixed-length [N, 1] calls, and
    varlen calls whose cu_seqlens the host checked. Unchecked (CULA_CHECK_VALUES=0), a varlen call's
    longest sequence is unknown and the loop kernel runs: the _one kernel gives its bits."""
    if family == "simple_gla" and v_first:
        pytest.skip("simple_gla takes key-first states only")
    n, heads = 40, 2
    v_heads = heads if family == "simple_gla" else 2 * heads
    g_ = torch.Generator(device="cuda").manual_seed(11)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=g_)  # noqa: E731
    q, k = (rnd(1, n, heads, dim).to(torch.bfloat16) for _ in range(2))
    v = rnd(1, n, v_heads, dim).to(torch.bfloat16)
    g = -torch.rand(1, n, v_heads, *((dim,) if family == "kda" else ()), device="cuda", generator=g_)
    beta = torch.rand(1, n, v_heads, device="cuda", generator=g_)
    h0 = rnd(n, v_heads, dim, dim) * 0.1
    cu = cu_seqlens_of([1] * n, torch.int32)

    def run(fixed):
        x = [a.view(n, 1, *a.shape[2:]) if fixed else a for a in (q, k, v, g, beta)]
        kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=None if fixed else cu)
        if family == "simple_gla":
            return cula.fused_recurrent_simple_gla(x[0], x[1], x[2], g=x[3], **kw)
        kw.update(beta=x[4], use_qk_l2norm_in_kernel=True, state_v_first=v_first)
        if family == "kda":
            return cula.fused_recurrent_kda(x[0], x[1], x[2], x[3], **kw)
        return cula.fused_recurrent_gated_delta_rule(x[0], x[1], x[2], g=x[3], **kw)

    prefix = {"gdn": "cula_gdn_recurrent_", "kda": "cula_kda_recurrent_", "simple_gla": "cula_gated_recurrent_"}[family]
    loop = f"_d{dim}" + ("_vfirst" if v_first else "")
    results = {}
    for how, fixed, checked in (("fixed", True, True), ("varlen", False, True), ("unchecked", False, False)):
        monkeypatch.setenv("CULA_CHECK_VALUES", "1" if checked else "0")
        names = [e for e in _gpu_work(lambda: run(fixed)) if e.startswith(prefix)]  # noqa: B023
        suffix = loop + ("_one" if dim == 64 and checked else "")
        assert len(names) == 1 and names[0].endswith(suffix), f"{how}: {names}, expected *{suffix}"
        results[how] = run(fixed)
    for how in ("fixed", "varlen"):
        for name, a, b in zip(("o", "final state"), results[how], results["unchecked"], strict=True):
            assert torch.equal(a.reshape(b.shape), b), f"{how}: {name} differs from the loop kernel's"


def packed(lengths, heads_v=HV, seed=7):
    """SGLang's packed projection [T, 2 H K + HV V] (bf16) and q, k, v as views of it, [1, T, ..]."""
    g_ = torch.Generator(device="cuda").manual_seed(seed)
    total, qk = sum(lengths), H * D
    mixed = torch.randn(total, 2 * qk + heads_v * D, device="cuda", generator=g_).to(torch.bfloat16)
    q, k, v = (mixed[:, :qk].reshape(1, total, H, D), mixed[:, qk:2 * qk].reshape(1, total, H, D),
               mixed[:, 2 * qk:].reshape(1, total, heads_v, D))
    return mixed, q, k, v


@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
def test_sglang_packed_decode(is_kda, checked, monkeypatch):
    """SGLang's packed decode (q, k, v read in mixed_qkv's rows, o into out): o and the pool bit for
    bit those of its fused-gating decode on contiguous copies (tested against the reference above);
    with CULA_CHECK_VALUES=0 through the C fast path."""
    if not checked:
        monkeypatch.setenv("CULA_CHECK_VALUES", "0")
    slots = [5, 0, -1, 3, 6]
    _, _, _, a, b, A_log, dt_bias, cu, pool = case([1] * 5, is_kda, seed=8)
    mixed, q, k, v = packed([1] * 5)
    want_pool, got_pool = pool.clone(), pool.clone()
    idx = torch.tensor(slots, device="cuda", dtype=torch.int32)
    want = sglang.fused_sigmoid_gating_delta_rule_update(
        A_log, a, dt_bias, 1.0, 20.0, q.contiguous(), k.contiguous(), v.contiguous(), b, want_pool, idx,
        scale=D ** -0.5, use_qk_l2norm_in_kernel=True, cu_seqlens=cu, is_kda=is_kda)
    fn = (sglang.fused_recurrent_kda_packed_decode if is_kda
          else sglang.fused_recurrent_gated_delta_rule_packed_decode)
    out = torch.empty(5, 1, HV, D, device="cuda", dtype=torch.bfloat16)
    got, final = fn(mixed, a.flatten(1) if is_kda else a, b, A_log, dt_bias.flatten() if is_kda else dt_bias,
                    D ** -0.5, got_pool, out, idx, use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    assert got is out and final is got_pool
    assert torch.equal(want[0], out[:, 0]), "o differs from the fused-gating decode's"
    assert torch.equal(want_pool, got_pool), "the pool differs from the fused-gating decode's"


@pytest.mark.parametrize("op", ["fused_recurrent_gated_delta_rule", "fused_recurrent_kda", "fused_recurrent_simple_gla",
                                "gated_delta_rule_decode"])
def test_strided_rows(op):
    """q, k and v as views of one packed projection run in place (their row stride), bit for bit the
    call on contiguous copies: varlen sequences of several tokens, and a [N, T, ..] decode."""
    lengths = [3, 1, 6]
    q_, k_, v_, a, b, A_log, dt_bias, cu, pool = case(lengths, op == "fused_recurrent_kda", seed=9)
    heads_v = H if op == "fused_recurrent_simple_gla" else HV
    _, q, k, v = packed(lengths, heads_v)
    fn = getattr(cula, op)
    if op == "fused_recurrent_simple_gla":
        kw = dict(g=-a[:, :H].abs().unsqueeze(0) * 0.1, initial_state=t(pool[:3, :H]).contiguous(),
                  output_final_state=True, cu_seqlens=cu)
    elif op == "gated_delta_rule_decode":
        q, k, v = (x.reshape(2, 5, *x.shape[2:]) for x in (q[:, :10], k[:, :10], v[:, :10]))
        kw = dict(g=a[:10].reshape(2, 5, HV), beta=b[:10].reshape(2, 5, HV).sigmoid(),
                  state_indices=torch.tensor([[1, 4, 6, 7, 8], [2, 3, 9, 10, 11]], device="cuda"))
    else:
        kw = dict(g=a.unsqueeze(0), beta=b.unsqueeze(0), initial_state=pool[:3].clone(), output_final_state=True,
                  use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    if op == "gated_delta_rule_decode":
        want_pool, got_pool = pool.clone(), pool.clone()
        want = fn(q.contiguous(), k.contiguous(), v.contiguous(), state=want_pool, **kw)
        got = fn(q, k, v, state=got_pool, **kw)
        torch.cuda.synchronize()
        assert torch.equal(want, got) and torch.equal(want_pool, got_pool)
        return
    want = fn(q.contiguous(), k.contiguous(), v.contiguous(), **kw)
    got = fn(q, k, v, **kw)
    torch.cuda.synchronize()
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


@pytest.mark.parametrize("call", ["fused_gating", "packed"])
def test_sglang_kda_lower_bound(call):
    """Newer SGLang's KDA calls with lower_bound: the bounded gate lower_bound sigmoid(exp(A_log)
    (a + dt_bias)) against the reference, through the fused-gating decode and the packed decode."""
    slots = [5, 0, -1, 3, 6]
    _, _, _, a, b, A_log, dt_bias, cu, pool = case([1] * 5, True, seed=10)
    mixed, q, k, v = packed([1] * 5)
    start, idx = pool.clone(), torch.tensor(slots, device="cuda")
    if call == "packed":
        out = torch.empty(5, 1, HV, D, device="cuda", dtype=torch.bfloat16)
        sglang.fused_recurrent_kda_packed_decode(mixed, a.flatten(1), b, A_log, dt_bias.flatten(), None, pool, out, idx,
                                                 use_qk_l2norm_in_kernel=True, lower_bound=-5.0)
        o = out.transpose(0, 1)
    else:
        o = sglang.fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, 1.0, 20.0, q, k, v, b, pool, idx,
                                                          use_qk_l2norm_in_kernel=True, cu_seqlens=cu, is_kda=True,
                                                          lower_bound=-5.0)
    torch.cuda.synchronize()
    check_decode((q, k, v, a, b, A_log, dt_bias, cu), start, slots, o, pool, lower_bound=-5.0)
