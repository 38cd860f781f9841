"""Value-first states (FLA's ``state_v_first=True``: ``[N, HV, V, K]``, the layout of SGLang's
pools) in the gated delta rule and KDA, on a real GPU. A call with value-first states must give
the key-first call's output and its states transposed: every kernel that touches states is run
both ways (the chunked kernels in one and two launches, sm_90a and generic, walking CTAs, the token
loop; the decode and vLLM's pool calls, per-token states; the fast path and the Python path), and
FLA 0.6.0's own state_v_first calls where FLA is installed. The chunked kernels run on key-first
copies of the states: their results must agree bit for bit. The token loop's value-first kernels
place their threads otherwise (so that a warp reads whole 128-byte lines of a column), which sums
the rows in another order: there the two may differ by float32 rounding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)

import cula  # noqa: E402
import test_gated_delta_rule as gdn  # noqa: E402
import test_kda as kda  # noqa: E402
from cula._reference import rms_ratio  # noqa: E402
from test_ops_gpu import cu_seqlens_of  # noqa: E402


def t(x):
    """[.., K, V] <-> [.., V, K], contiguous."""
    return x.transpose(-1, -2).contiguous()


def assert_same(a, b, what, exact=True):
    """Bit for bit, or (exact=False: the rows summed in another order) within rounding: float32
    states within 1e-5 (RMS ratio), 16-bit outputs within about one unit of their last place."""
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {b.shape} {b.dtype} vs {a.shape} {a.dtype}"
    if exact:
        assert torch.equal(a, b), f"{what}: max |diff| {(a.float() - b.float()).abs().max().item():.3e}"
    else:
        err, tol = rms_ratio(a.double(), b.double()), 1e-5 if a.dtype == torch.float32 else 4e-3
        assert err <= tol, f"{what}: rms ratio {err:.2e} > {tol}"


def inputs(family, lengths, heads, v_heads, dim, with_state=True, seed=3, gate_in_kernel=True):
    """Varlen inputs ([1, sum(lengths), ...] with cu_seqlens) for a list of lengths, fixed-length
    ([B, T, ...]) for a (B, T) tuple; the op's keywords (states key-first)."""
    fixed = isinstance(lengths, tuple)
    batch, total = lengths if fixed else (1, sum(lengths))
    nseq = batch if fixed else len(lengths)
    make = kda.make if family == "kda" else gdn.make
    if family == "kda":
        extra = {"gate": "softplus" if gate_in_kernel else "g"}
    else:
        extra = {"gate_in_kernel": gate_in_kernel}
    q, k, v, g, beta, h0, kw = make(batch, total, heads, v_heads, dim, seed=seed, nseq=nseq, with_state=with_state,
                                    **extra)
    kw = dict(kw, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    if family != "kda" and gate_in_kernel:
        kw["use_gate_in_kernel"] = True
    if not fixed:
        kw["cu_seqlens"] = cu_seqlens_of(lengths, torch.int32)
    return (q, k, v, g, beta), kw


def run_both_ways(run, args, kw, what, exact=True):
    """run(*args, **kw) with the states key-first and value-first: the same o, the states transposed."""
    o, ht = run(*args, **kw)
    h0 = kw["initial_state"]
    o_v, ht_v = run(*args, **dict(kw, initial_state=None if h0 is None else t(h0), state_v_first=True))
    assert_same(o, o_v, f"{what}: o", exact)
    assert_same(ht, t(ht_v), f"{what}: final state (transposed)", exact)
    if h0 is not None:  # (the final states depend on the initial ones: a kernel reading h0 key-first would differ)
        assert not torch.equal(ht, ht_v), f"{what}: the final state is its own transpose"


SHAPES = {  # lengths ((B, T): fixed), H, HV, D
    "B2T130D64": ((2, 130), 2, 4, 64),
    "B1T70D128": ((1, 70), 1, 2, 128),
    "varlen_empty_short_D128": ([0, 1, 64, 200, 5], 2, 4, 128),
}
GDN_OPS = ["chunk:1", "chunk:1:generic", "chunk:2", "chunk:2:generic", "recurrent"]
KDA_OPS = ["chunk", "chunk:generic", "recurrent"]
RUNS = [("gdn", op) for op in GDN_OPS] + [("kda", op) for op in KDA_OPS]


@pytest.mark.parametrize("family, op", RUNS, ids=lambda x: x)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_sequence_ops(family, op, shape):
    lengths, heads, v_heads, dim = SHAPES[shape]
    args, kw = inputs(family, lengths, heads, v_heads, dim)
    run = (kda if family == "kda" else gdn).run_op
    run_both_ways(lambda *a, **k: run(op, *a, **k), args, kw, f"{family} {op} {shape}",
                  exact=op != "recurrent")


@pytest.mark.parametrize("family, op", [("gdn", "chunk:1"), ("kda", "chunk"), ("gdn", "recurrent")])
def test_no_initial_state(family, op):
    args, kw = inputs(family, [3, 0, 100], 2, 4, 64, with_state=False)
    run = (kda if family == "kda" else gdn).run_op
    run_both_ways(lambda *a, **k: run(op, *a, **k), args, kw, f"{family} {op}", exact=op != "recurrent")


@pytest.mark.parametrize("op", ["chunk:1", "chunk:1:generic"])
def test_walking_ctas(op):
    """More (sequence, value head, value slice) items than SMs, of few chunks: the one-launch
    kernel's CTAs walk several items each (empty sequences copy their states in the walk's table fill)."""
    gen = torch.Generator().manual_seed(5)
    lengths = torch.randint(0, 200, (90,), generator=gen).tolist()
    lengths[7] = 0
    args, kw = inputs("gdn", lengths, 1, 2, 64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CULA_GDN_WALK", "1")
        run_both_ways(lambda *a, **k: gdn.run_op(op, *a, **k), args, kw, f"walk {op}")


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("check_indices", [True, False], ids=["python_path", "fast_path"])
@pytest.mark.parametrize("dim", [64, 128])
def test_decode_pool(family, tokens, check_indices, dim):
    """The serving decode on a pool in place: [N] slots (one token) or [N, S] slots with accepted
    counts (speculative tokens), a padding sequence among them. check_indices=False is the C fast
    path's call, True the Python path's."""
    n, heads, v_heads, pool_size = 5, 2, 4, 16
    (q, k, v, g, beta), kw = inputs(family, (n, tokens), heads, v_heads, dim, with_state=False)
    kw = {name: kw[name] for name in ("A_log", "dt_bias", "lower_bound", "use_gate_in_kernel") if name in kw}
    if tokens == 1:
        q, k, v, g, beta = (x[:, 0] for x in (q, k, v, g, beta))
    idx, acc, _ = gdn.pool_case(tokens)
    pool = torch.randn(pool_size, v_heads, dim, dim, device="cuda") * 0.1
    decode = cula.kda_decode if family == "kda" else cula.gated_delta_rule_decode
    pools, outs = [pool.clone(), t(pool)], []
    for v_first, p in zip((False, True), pools, strict=True):
        outs.append(decode(q, k, v, g, beta, p, state_indices=idx, num_accepted_tokens=acc, check_indices=check_indices,
                           use_qk_l2norm_in_kernel=True, state_v_first=v_first, **kw))
    assert_same(outs[0], outs[1], "o", exact=False)  # (the token loop's value-first layout: the top)
    assert_same(pools[0], t(pools[1]), "pool (transposed)", exact=False)
    assert not torch.equal(pools[0], pool), "the decode wrote no state"


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("in_place", [True, False], ids=["pool", "per_token_states"])
def test_vllm_pool_call(family, in_place):
    """vLLM's call of fused_recurrent_*: packed sequences, the pool with [N, S] slots and accepted
    counts written in place, or one state per token returned (inplace_final_state=False)."""
    (q, k, v, g, beta), kw = inputs(family, [3, 3, 3], 2, 4, 64, with_state=False)
    del kw["output_final_state"], kw["initial_state"]
    idx = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8]], device="cuda", dtype=torch.int32)
    acc = torch.tensor([2, 1, 3], device="cuda", dtype=torch.int32)
    pool = torch.randn(10, 4, 64, 64, device="cuda") * 0.1
    op = cula.fused_recurrent_kda if family == "kda" else cula.fused_recurrent_gated_delta_rule
    pools, results = [pool.clone(), t(pool)], []
    for v_first, p in zip((False, True), pools, strict=True):
        results.append(op(q, k, v, g=g, beta=beta, initial_state=p, inplace_final_state=in_place,
                           ssm_state_indices=idx if in_place else idx[:, 0].contiguous(),
                           num_accepted_tokens=acc if in_place else None, state_v_first=v_first, **kw))
    (o, ht), (o_v, ht_v) = results
    assert_same(o, o_v, "o", exact=False)
    assert_same(ht, t(ht_v), "states (transposed)", exact=False)
    assert_same(pools[0], t(pools[1]), "pool (transposed)", exact=False)


def test_options():
    """FLA's deprecated name for the option, and its rule: not both."""
    args, kw = inputs("gdn", (1, 10), 2, 2, 64)
    o, ht = cula.chunk_gated_delta_rule(*args, **kw)
    h0 = t(kw.pop("initial_state"))
    with pytest.warns(DeprecationWarning, match="transpose_state_layout is deprecated"):
        o_v, ht_v = cula.chunk_gated_delta_rule(*args, initial_state=h0, transpose_state_layout=True, **kw)
    assert_same(o, o_v, "o")
    assert_same(ht, t(ht_v), "final state (transposed)")
    with pytest.raises(ValueError, match="cannot pass both state_v_first and the deprecated transpose_state_layout"):
        cula.chunk_gated_delta_rule(*args, initial_state=h0, state_v_first=True, transpose_state_layout=True, **kw)
    with pytest.raises(TypeError, match="state_v_first must be a bool, got int"):
        cula.gated_delta_rule_decode(*(x[:, 0] for x in args), torch.zeros(1, 2, 64, 64, device="cuda"),
                                     state_v_first=1)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_against_fla(family):
    """FLA 0.6.0's chunk op with state_v_first=True on the same call: the same states."""
    fla = pytest.importorskip(f"fla.ops.{'kda' if family == 'kda' else 'gated_delta_rule'}",
                              reason="FLA (fla-core) is not installed")
    name = "chunk_kda" if family == "kda" else "chunk_gated_delta_rule"
    args, kw = inputs(family, [100, 37, 129], 2, 4, 128, gate_in_kernel=False)
    kw["initial_state"] = t(kw["initial_state"])
    with torch.no_grad():
        o_fla, ht_fla = getattr(fla, name)(*args, state_v_first=True, **kw)
        o, ht = getattr(cula, name)(*args, state_v_first=True, **kw)
    assert rms_ratio(ht_fla.double(), ht.double()) <= 2 * gdn.TOL
    assert rms_ratio(o_fla.double(), o.double()) <= 2 * gdn.TOL
