"""SGLang's extend call of the chunk ops on a real GPU: ``initial_state`` a state pool (key-first
or value-first), read at the slots ``initial_state_indices`` and, with ``inplace_update``, written
back there. Each pool call must give what the plain call gives on the gathered states: the same o
(zero for a padding sequence, slot -1) and the same final states, in the pool's slots (the other
slots untouched) or returned; bit for bit, since both run the same kernels on the same numbers
(the chunked kernels one and two launches, sm_90a and generic, the token loop of short calls)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import cula  # noqa: E402
import test_gated_delta_rule as gdn  # noqa: E402
import test_kda as kda  # noqa: E402
from cula._reference import gated_delta_rule_reference  # noqa: E402
from test_ops_gpu import cu_seqlens_of  # noqa: E402
from test_state_layout import assert_same, inputs, t  # noqa: E402

LONG = [0, 1, 64, 130, 5]  # (empty, one token, a chunk, more; the padding one is the 130-token sequence)
SHORT = [0, 1, 6, 3, 5]    # the token loop's (6 tokens at most: the gated delta rule's bound)
SLOTS = [3, 9, 7, -1, 0]   # the sequences' slots in a pool of POOL
POOL = 12
GDN_OPS = ["chunk:1", "chunk:1:generic", "chunk:2", "chunk:2:generic", "loop"]
KDA_OPS = ["chunk", "chunk:generic", "loop"]
RUNS = [("gdn", op) for op in GDN_OPS] + [("kda", op) for op in KDA_OPS]


def run(family, op, args, kw):
    if op == "loop":
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CULA_CHUNK_TOKEN_LOOP", "1")
            return (cula.chunk_kda if family == "kda" else cula.chunk_gated_delta_rule)(*args, **kw)
    return (kda if family == "kda" else gdn).run_op(op, *args, **kw)


def pool_case(family, op, dim, v_first, index_dtype=torch.int32):
    """Inputs, the pool (in its layout) and the slots; the plain call's keywords on the gathered states."""
    lengths = SHORT if op == "loop" else LONG
    args, kw = inputs(family, lengths, 2, 4, dim, with_state=False, seed=11)
    gen = torch.Generator(device="cuda").manual_seed(7)
    pool = torch.randn(POOL, 4, dim, dim, device="cuda", generator=gen) * 0.1
    idx = torch.tensor(SLOTS, device="cuda", dtype=index_dtype)
    gathered = pool[idx.clamp(min=0)] * (idx >= 0).view(-1, 1, 1, 1)  # (a padding sequence: a zero state)
    kw = dict(kw, state_v_first=v_first)
    del kw["initial_state"]
    return args, kw, pool, idx, gathered


def tokens_of(seq, lengths):
    start = sum(lengths[:seq])
    return slice(start, start + lengths[seq])


@pytest.mark.parametrize("family, op", RUNS, ids=lambda x: x)
@pytest.mark.parametrize("v_first", [False, True], ids=["keys_first", "values_first"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "read_only"])
def test_pool_call(family, op, v_first, in_place):
    dim = 128 if family == "kda" or ":2" in op else 64
    args, kw, pool, idx, gathered = pool_case(family, op, dim, v_first)
    lengths = SHORT if op == "loop" else LONG
    final = not in_place and op != "loop"  # (final states to [N, ..] take the chunked kernels, not the token loop)
    o_ref, ht_ref = run(family, op, args, dict(kw, initial_state=gathered, output_final_state=True))
    pooled = pool.clone()
    o, ht = run(family, op, args, dict(kw, initial_state=pooled, output_final_state=final,
                                       initial_state_indices=idx, inplace_update=in_place))
    pad = SLOTS.index(-1)
    keep = torch.ones(o.shape[1], dtype=torch.bool, device="cuda")
    keep[tokens_of(pad, lengths)] = False
    assert_same(o_ref[:, keep], o[:, keep], "o")
    assert torch.count_nonzero(o[:, ~keep]) == 0, "a padding sequence's o is not zero"
    live = [n for n, s in enumerate(SLOTS) if s >= 0]
    untouched = [s for s in range(POOL) if s not in SLOTS or not in_place]
    assert_same(pool[untouched], pooled[untouched], "the pool's other slots")
    if in_place:
        assert ht is pooled, "final_state is not the pool"
        assert_same(ht_ref[live], pooled[[SLOTS[n] for n in live]], "final states in the pool")
    elif final:
        assert_same(ht_ref[live], ht[live], "final states")
        assert torch.count_nonzero(ht[pad]) == 0, "a padding sequence's final state is not zero"
    else:
        assert ht is None


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_sglang_extend(family):
    """The call as SGLang's extend makes it: a value-first pool, int64 slots and cu_seqlens (its
    query_start_loc), the gate in the kernel, l2norm, the final states in place; against the float64
    reference from the slots' states."""
    args, kw, pool, idx, gathered = pool_case(family, "chunk", 128, True, torch.int64)
    kw["cu_seqlens"] = cu_seqlens_of(LONG, torch.int64)
    del kw["output_final_state"]
    pooled = pool.clone()
    op = cula.chunk_kda if family == "kda" else cula.chunk_gated_delta_rule
    o, ht = op(*args, initial_state=pooled, initial_state_indices=idx, head_first=False, inplace_update=True, **kw)
    ref_kw = {name: kw[name] for name in ("A_log", "dt_bias", "lower_bound") if name in kw}
    ref_o, ref_h = gated_delta_rule_reference(*args, None, t(gathered), kw["cu_seqlens"], l2norm=True,
                                              gate_in_kernel=True, **ref_kw)
    pad = SLOTS.index(-1)
    keep = torch.ones(o.shape[1], dtype=torch.bool, device="cuda")
    keep[tokens_of(pad, LONG)] = False
    gdn.check(ref_o[:, keep], o[:, keep], "o")
    live = [n for n, s in enumerate(SLOTS) if s >= 0]
    gdn.check(ref_h[live], t(pooled[[SLOTS[n] for n in live]]), "final states in the pool")


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_pool_call_in_cuda_graph(family):
    """SGLang's extend captured in a CUDA graph (no host reads of cu_seqlens or of the slots then) and
    replayed: o and the pool bit for bit as the eager call leaves them."""
    args, kw, pool, idx, _ = pool_case(family, "chunk", 128, True)
    del kw["output_final_state"]
    op = cula.chunk_kda if family == "kda" else cula.chunk_gated_delta_rule
    eager_pool, graph_pool = pool.clone(), pool.clone()
    want, _ = op(*args, initial_state=eager_pool, initial_state_indices=idx, **kw)
    op(*args, initial_state=pool.clone(), initial_state_indices=idx, **kw)  # (warm-up, on a pool of its own)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, ht = op(*args, initial_state=graph_pool, initial_state_indices=idx, **kw)
    assert torch.equal(graph_pool, pool), "the capture ran the kernels"
    graph.replay()
    torch.cuda.synchronize()
    assert ht is graph_pool
    assert_same(want, o, "o")
    assert_same(eager_pool, graph_pool, "the pool")


def test_pool_errors():
    args, kw, pool, idx, _ = pool_case("gdn", "chunk:1", 64, False)
    del kw["output_final_state"]
    op = cula.chunk_gated_delta_rule
    with pytest.raises(ValueError, match="output_final_state must be False"):
        op(*args, initial_state=pool, initial_state_indices=idx, output_final_state=True, **kw)
    with pytest.raises(ValueError, match="inplace_update=True needs initial_state_indices"):
        op(*args, initial_state=pool[:5], inplace_update=True, **kw)
    with pytest.raises(ValueError, match="initial_state_indices needs initial_state"):
        op(*args, initial_state_indices=idx, **kw)
    with pytest.raises(ValueError, match=r"initial_state_indices must have shape \[N\] = \[5\]"):
        op(*args, initial_state=pool, initial_state_indices=idx[:4], **kw)
    with pytest.raises(ValueError, match=r"initial_state_indices must lie in \[-1, 12\)"):
        op(*args, initial_state=pool, initial_state_indices=idx + 5, **kw)
    with pytest.raises(TypeError, match="initial_state_indices must be int32 or int64"):
        op(*args, initial_state=pool, initial_state_indices=idx.float(), **kw)
    with pytest.raises(ValueError, match=r"is updated in place, so each of its \[4, \d+, \d+\] states must be"):
        op(*args, initial_state=t(pool).transpose(-1, -2), initial_state_indices=idx, **kw)
    with pytest.raises(TypeError, match="inplace_update must be a bool"):
        op(*args, initial_state=pool, initial_state_indices=idx, inplace_update=1, **kw)
    before = pool.clone()
    o, ht = op(*args, initial_state=pool, initial_state_indices=idx, inplace_update=False, **kw)
    assert ht is None and torch.equal(before, pool), "inplace_update=False wrote the pool"
