"""State pools whose slots lie apart, as vLLM keeps them, on a real GPU. vLLM's hybrid cache gives a
linear-attention layer one page per slot that holds its conv state and then its ssm state, and hands
the layer `torch.as_strided` views of the pages: the ssm pool `[P, HV, K, V]` has a slot stride of
a whole page, more than HV K V. Every op that reads or writes a pool at slots must use such a pool
where it is: give what the same call gives on a contiguous copy, bit for bit (same kernels, same
numbers), write only its slots' states and leave the rest of each page (the conv state) alone. Ops
and paths: the decode ops (one token, speculative tokens with num_accepted_tokens; key-first and
value-first), vLLM's pool keywords of the fused_recurrent ops (in place, and one state per token from
a pool only read), SGLang's pool keywords of the chunk ops (the chunked kernels through the stage
kernel, the token loop), simple_gla's decode, a decode step captured in a CUDA graph; and the
layouts that cannot be used where they are: refused in place, copied where only read."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import cula  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from test_ops_gpu import cu_seqlens_of  # noqa: E402
from test_state_layout import assert_same  # noqa: E402

SENTINEL = 1234.5  # what the rest of each page holds (the conv state's place)
SLOTS = [5, 0, -1, 3]  # the sequences' slots (-1: a padding sequence)
POOL = 7


def paged(pool, front=3 * 128 + 4, back=12):
    """`pool` ([P, ..] contiguous float32) copied into pages of `front` + one state + `back` floats,
    the state at `front` (a multiple of 4: 16-byte aligned) and SENTINEL around it: (the view, as
    vLLM's `as_strided`, and the pages)."""
    size = pool[0].numel()
    page = front + size + back
    pages = torch.full((pool.shape[0] * page,), SENTINEL, device=pool.device)
    view = torch.as_strided(pages, pool.shape, (page, *pool[0].stride()), storage_offset=front)
    view.copy_(pool)
    assert not view.is_contiguous() and view.stride(0) == page
    return view, pages


def gaps_untouched(view, pages):
    """True when every float of the pages outside the view's states is still SENTINEL."""
    mask = torch.ones_like(pages, dtype=torch.bool)
    torch.as_strided(mask, view.shape, view.stride(), view.storage_offset()).fill_(False)
    return bool((pages[mask] == SENTINEL).all())


def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def tokens(n, t, h, hv, d, seed=0, per_key=False):
    """q, k [n, t, h, d], v [n, t, hv, d] bf16; g (log decay; [.., hv, d] with per_key) and beta."""
    g_ = gen(seed)
    q, k = (torch.randn(n, t, h, d, device="cuda", generator=g_, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(n, t, hv, d, device="cuda", generator=g_, dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(n, t, hv, *((d,) if per_key else ()), device="cuda", generator=g_)) * 0.2
    beta = torch.rand(n, t, hv, device="cuda", generator=g_)
    return q, k, v, g, beta


def pool_of(hv, d, seed=1, slots=POOL):
    return torch.randn(slots, hv, d, d, device="cuda", generator=gen(seed)) * 0.1


def live(x, lengths, slots):
    """The rows of x ([1, T, ..], per token) of the sequences that are not padding (slot -1): a
    padding sequence's per-token states are never written."""
    keep = []
    for n, slot in zip(lengths, slots, strict=True):
        keep += [slot >= 0] * n
    return x[torch.tensor(keep, device=x.device)]


def both(call, pool):
    """call(pool) on a contiguous copy of `pool` and on a paged one: (result, pool) for each, the
    pages checked for writes outside the states."""
    flat = pool.clone()
    want = call(flat)
    view, pages = paged(pool)
    got = call(view)
    torch.cuda.synchronize()
    assert gaps_untouched(view, pages), "the call wrote outside the pool's states (into the rest of a page)"
    return want, flat, got, view


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("v_first", [False, True], ids=["keys_first", "values_first"])
@pytest.mark.parametrize("d", [64, 128])
def test_decode(family, v_first, d):
    q, k, v, g, beta = tokens(len(SLOTS), 1, 2, 4, d, per_key=family == "kda")
    idx = torch.tensor(SLOTS, device="cuda", dtype=torch.int32)
    op = cula.kda_decode if family == "kda" else cula.gated_delta_rule_decode

    def call(pool):
        return op(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], pool, state_indices=idx,
                  use_qk_l2norm_in_kernel=True, state_v_first=v_first)
    want, flat, got, view = both(call, pool_of(4, d))
    assert_same(want, got, "o")
    assert_same(flat, view, "the pool")


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_speculative_decode(family):
    """T = 3 draft tokens a sequence: read the slot of the accepted prefix, write one slot per token
    (a sequence's own slots; -1: that token's state not kept)."""
    n, steps = 3, 3
    q, k, v, g, beta = tokens(n, steps, 2, 4, 128, seed=2, per_key=family == "kda")
    idx = torch.tensor([[0, 1, 2, 3], [4, 5, -1, 6], [7, 8, 9, 10]], device="cuda", dtype=torch.int64)
    acc = torch.tensor([2, 1, 3], device="cuda", dtype=torch.int64)
    op = cula.kda_decode if family == "kda" else cula.gated_delta_rule_decode

    def call(pool):
        return op(q, k, v, g, beta, pool, state_indices=idx, num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True)
    want, flat, got, view = both(call, pool_of(4, 128, slots=12))
    assert_same(want, got, "o")
    assert_same(flat, view, "the pool")


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "per_token"])
def test_vllm_recurrent(family, in_place):
    """vLLM's call of fused_recurrent_*: varlen tokens, the pool at ssm_state_indices, the states
    back to the slots (inplace_final_state) or one per token (the pool only read)."""
    lengths = [1, 3, 2, 1]
    q, k, v, g, beta = tokens(1, sum(lengths), 2, 4, 128, seed=3, per_key=family == "kda")
    cu = cu_seqlens_of(lengths, torch.int32)
    idx = torch.tensor(SLOTS, device="cuda", dtype=torch.int32)
    op = cula.fused_recurrent_kda if family == "kda" else cula.fused_recurrent_gated_delta_rule

    def call(pool):
        return op(q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, inplace_final_state=in_place, cu_seqlens=cu,
                  ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    want, flat, got, view = both(call, pool_of(4, 128))
    assert_same(want[0], got[0], "o")
    assert_same(flat, view, "the pool")
    if in_place:
        assert got[1] is view, "final_state is not the pool"
    else:
        assert_same(live(want[1], lengths, SLOTS), live(got[1], lengths, SLOTS), "the per-token states")


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("path", ["chunked", "token_loop"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "read_only"])
@pytest.mark.parametrize("v_first", [False, True], ids=["keys_first", "values_first"])
def test_sglang_extend(family, path, in_place, v_first, monkeypatch):
    """SGLang's keywords of the chunk ops: the chunked kernels (the stage kernel gathers the slots'
    states and scatters the final ones) and the token loop of short calls."""
    monkeypatch.setenv("CULA_CHUNK_TOKEN_LOOP", "1" if path == "token_loop" else "0")
    lengths = [70, 2, 5, 1] if path == "chunked" else [3, 2, 5, 1]
    q, k, v, g, beta = tokens(1, sum(lengths), 2, 4, 128, seed=4, per_key=family == "kda")
    cu = cu_seqlens_of(lengths, torch.int32)
    idx = torch.tensor(SLOTS, device="cuda", dtype=torch.int64)
    op = cula.chunk_kda if family == "kda" else cula.chunk_gated_delta_rule
    final = not in_place and path == "chunked"

    def call(pool):
        return op(q, k, v, g, beta, initial_state=pool, initial_state_indices=idx, inplace_update=in_place,
                  output_final_state=final, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, state_v_first=v_first)
    want, flat, got, view = both(call, pool_of(4, 128))
    assert_same(want[0], got[0], "o")
    assert_same(flat, view, "the pool")
    if final:
        assert_same(want[1], got[1], "the final states")


@pytest.mark.parametrize("gate", ["g_gamma", "g"])
def test_simple_gla_decode(gate):
    q, k, v, g, _ = tokens(len(SLOTS), 1, 4, 4, 128, seed=5)
    idx = torch.tensor(SLOTS, device="cuda", dtype=torch.int32)
    decay = {"g_gamma": -torch.rand(4, device="cuda", generator=gen(6))} if gate == "g_gamma" else {"g": g[:, 0]}

    def call(pool):
        return cula.simple_gla_decode(q[:, 0], k[:, 0], v[:, 0], pool, state_indices=idx, **decay)
    want, flat, got, view = both(call, pool_of(4, 128))
    assert_same(want, got, "o")
    assert_same(flat, view, "the pool")


def test_decode_in_cuda_graph():
    """A decode step on a paged pool captured in a CUDA graph and replayed: o and the pool as the
    eager step leaves them, the rest of the pages untouched."""
    q, k, v, g, beta = tokens(len(SLOTS), 1, 2, 4, 128, seed=7)
    idx = torch.tensor(SLOTS, device="cuda", dtype=torch.int32)
    pool = pool_of(4, 128)
    eager, _ = paged(pool)
    graph_pool, pages = paged(pool)
    out = torch.empty_like(v[:, 0])

    def step(p):
        return cula.gated_delta_rule_decode(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], p, state_indices=idx,
                                            use_qk_l2norm_in_kernel=True, out=out)
    want = step(eager).clone()
    step(paged(pool)[0])  # (warm-up, on pages of its own)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(graph_pool)
    assert_same(paged(pool)[0], graph_pool, "the pool before the replay")
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert_same(want, out, "o")
    assert_same(eager, graph_pool, "the pool")
    assert gaps_untouched(graph_pool, pages)


def test_layouts_not_taken():
    """A pool whose slots are not contiguous states: refused where it is written in place (nothing
    launched, the pool unchanged), copied where it is only read (the same results)."""
    q, k, v, g, beta = tokens(len(SLOTS), 1, 2, 4, 64, seed=8)
    idx = torch.tensor(SLOTS, device="cuda", dtype=torch.int32)
    pool = pool_of(4, 64)
    pages = pool.transpose(2, 3).contiguous()
    swapped = pages.transpose(2, 3)  # (the pool's values, each slot's rows and columns swapped in memory)
    before = swapped.clone()
    with pytest.raises(ValueError, match=r"^cula: state is updated in place, so each of its \[4, 64, 64\] states "
                                         r"must be contiguous and 16-byte aligned"):
        cula.gated_delta_rule_decode(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], swapped, state_indices=idx)
    assert_same(before, swapped, "a refused pool")
    odd, _ = paged(pool, front=2)  # (8-byte aligned slots)
    with pytest.raises(ValueError, match="16-byte aligned"):
        cula.gated_delta_rule_decode(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], odd, state_indices=idx)
    lengths = [1] * len(SLOTS)
    q1, k1, v1, g1, b1 = (x.reshape(1, -1, *x.shape[2:]) for x in (q, k, v, g, beta))
    kw = dict(cu_seqlens=cu_seqlens_of(lengths, torch.int32), ssm_state_indices=idx, inplace_final_state=False)
    o, per_token = cula.fused_recurrent_gated_delta_rule(q1, k1, v1, g=g1, beta=b1, initial_state=swapped, **kw)
    o_ref, ref = cula.fused_recurrent_gated_delta_rule(q1, k1, v1, g=g1, beta=b1, initial_state=pool, **kw)
    assert_same(o_ref, o, "o from a copied pool")
    assert_same(live(ref, lengths, SLOTS), live(per_token, lengths, SLOTS), "states from a copied pool")
    assert_same(before, swapped, "a pool only read")
