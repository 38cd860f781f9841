"""The host side of the gated recurrence (native/kernels/common/recurrence.cuh), which the gated
delta rule runs, KDA (the same with a per-key gate) and simple_gla with a per-token gate: checks of
the gates and of the state pools, and the launch."""

from __future__ import annotations

from . import _checks as C
from . import _fast, _torch
from ._common import dtype_enum, finish, ptr
from ._loader import backend, check_device

__all__ = ["chunk_call", "decode_call", "decode_op", "pool_mode", "recurrence_call", "sequence_op"]

# Where the kernel writes states (CULA_HT_* in native/kernels/params.h).
HT_NONE, HT_FINAL, HT_SLOT, HT_SLOT_TOKEN, HT_TOKEN = range(5)
# How it computes the log decay from g (CULA_GATE_*): as given, -exp(A_log) softplus(g + dt_bias),
# lower_bound sigmoid(exp(A_log) (g + dt_bias)).
GATE_RAW, GATE_SOFTPLUS, GATE_LOWER_BOUND = range(3)


def _code(a) -> int:
    return C.SCALAR_DTYPES[a.dtype] if a is not None else 0


def check_lower_bound(op, lower_bound, safe_gate=False, use_gate_in_kernel=False):
    """KDA's lower_bound (a finite float, or None) and safe_gate, with FLA's rule: a safe gate
    computed in the kernel needs a lower bound in [-5, 0)."""
    if safe_gate is False and (lower_bound is None or lower_bound.__class__ is float and -1e30 < lower_bound < 1e30):
        return lower_bound  # (the plain calls, first)
    if safe_gate is True and lower_bound.__class__ is float and -5 <= lower_bound < 0:
        return lower_bound  # (a safe gate in its range: valid with and without the gate in the kernel)
    C.check_flag(safe_gate, "safe_gate")
    lower_bound = C.check_float(lower_bound, "lower_bound")
    if safe_gate and use_gate_in_kernel is True:
        if lower_bound is None:
            raise ValueError(f"cula.{op}: lower_bound must be given when safe_gate=True and use_gate_in_kernel=True")
        if not -5 <= lower_bound < 0:
            raise ValueError(f"cula.{op}: lower_bound must be in the safe range [-5, 0), got {lower_bound}")
    return lower_bound


def gate_mode(use_gate_in_kernel, lower_bound) -> int:
    if not use_gate_in_kernel:
        return GATE_RAW
    return GATE_SOFTPLUS if lower_bound is None else GATE_LOWER_BOUND


def gates_of(op, g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, shape,
             layout, key_dim=0, lower_bound=None):
    """g, beta ([..., HV], as `shape`), A_log and dt_bias ([HV]) with FLA's rules for the options.
    With key_dim (KDA's per-key gate): g [..., HV, K], dt_bias [HV * K] or [HV, K], and with a
    lower_bound A_log may be None (the gate is then lower_bound sigmoid(g + dt_bias))."""
    for name, value in (("use_gate_in_kernel", use_gate_in_kernel),
                        ("use_beta_sigmoid_in_kernel", use_beta_sigmoid_in_kernel),
                        ("allow_neg_eigval", allow_neg_eigval)):
        C.check_flag(value, name)
    if use_gate_in_kernel:
        if A_log is None and (lower_bound is None or not key_dim):
            extra = " (or lower_bound set)" if key_dim else ""
            raise ValueError(f"cula.{op}: A_log ([HV]) must be given when use_gate_in_kernel=True{extra}")
        if g is None:
            raise ValueError(f"cula.{op}: g (the raw gate input) must be given when use_gate_in_kernel=True")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"cula.{op}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")
    if beta is not None and len(getattr(beta, "shape", ())) == len(shape) + 1:
        raise NotImplementedError(f"cula.{op}: a per-value-column beta ({layout[:-1]}, V]) is not supported; "
                                  f"pass beta as {layout}")
    g_shape, g_layout = ((*shape, key_dim), layout[:-1] + ", K]") if key_dim else (shape, layout)
    ga = C.check_token_scalars(g, "g", g_shape, g_layout) if g is not None else None
    ba = C.check_token_scalars(beta, "beta", shape, layout) if beta is not None else None
    heads = shape[-1]
    aa = C.check_head_param(A_log, "A_log", heads) if use_gate_in_kernel else None
    da = C.check_head_param(dt_bias, "dt_bias", heads, key_dim) if use_gate_in_kernel else None
    return ga, ba, aa, da


# The longest sequence's (tokens, index, first row) and the others' longest, as launch passes them
# where the check of cu_seqlens has not read them yet, and where it never will (the values unchecked)
_UNKNOWN, _UNREAD = (0, -1, 0, 0), (0, -2, 0, 0)


def launch(b, device, variant, qa, ka, va, oa, gates, h0, ht, ht_mode, indices, accepted, num_slots, seq, total,
           scale, l2norm, sigmoid, neg_eigval, delta=True, chunked=False, mode=GATE_RAW, lower_bound=None,
           per_key=False, later=(), longest=(), v_first=False, pitch=0, cache=None, parents=None,
           strides=(0, 0, 0)) -> None:
    """The launch, after the checks of values in device memory (`later`: C.run_later), which come as
    late as they can: after the workspace's allocation, right before the C call. `longest`: the
    cu_seqlens check's longest sequence, once it ran (the chunked prefill's choice of kernels, and
    the split of one long sequence among short ones, whose room in the workspace is kept before);
    v_first: the states (h0, ht) are [.., V, K]. chunked with indices: h0 is a pool read at the slots
    (SGLang's initial_state_indices), the final states back to it (HT_SLOT), to ht [N, ..] or nowhere.
    pitch: the pool's (h0's, and ht's where ht is the pool: HT_SLOT, HT_SLOT_TOKEN; C.check_pool), 0
    for contiguous states. cache: a speculative verify's (buffer, its indices), the states after each
    token also kept there; parents: an EAGLE tree's parent tokens; strides: q's, k's and v's from one
    token's row to the next (C.prepare_rows; 0: contiguous). The last three for the token loop only."""
    ga, ba, aa, da = gates
    heads, v_heads, dim = qa.shape[-2], va.shape[-2], qa.shape[-1]
    workspace = None  # the chunked prefill's: products of the chunks between two launches, key-first states
    # (the longest sequence where the check has read it; else the size covers whatever the lengths hold)
    most, at, _, second = longest or _UNKNOWN
    nbytes = (b.module.chunk_workspace(per_key, delta, total, seq[2], seq[3], most, at, v_heads, dim, variant, device,
                                       v_first, indices is not None, ht_mode == HT_FINAL, second)
              if chunked else 0)
    if nbytes:
        workspace = qa.empty((nbytes // 4,), "float32")
    stride = 1 if indices is None or len(indices.shape) == 1 else indices.shape[1]
    buf, bufi = cache if cache is not None else (None, None)
    head = (  # the arguments before `longest`, and after it: built before the checks, which wait for the GPU
        qa.ptr, ka.ptr, va.ptr, oa.ptr, ptr(ga), _code(ga), ptr(ba), _code(ba), ptr(aa), _code(aa), ptr(da), _code(da),
        mode, 0.0 if lower_bound is None else lower_bound, per_key, ptr(h0), ptr(ht), ht_mode, v_first, ptr(indices),
        indices is not None and indices.dtype == "int64", stride,
        ptr(accepted), accepted is not None and accepted.dtype == "int64", num_slots, *strides, pitch,
        pitch if ht_mode in (HT_SLOT, HT_SLOT_TOKEN) else 0, ptr(buf), ptr(bufi), bufi is not None and
        bufi.dtype == "int64", buf.shape[1] if buf is not None else 0, buf.shape[0] if buf is not None else 0,
        ptr(parents), parents is not None and parents.dtype == "int64", parents.shape[1] if parents is not None else 0,
        *seq, total)
    tail = (heads, v_heads, dim, dtype_enum(b, qa), scale, l2norm, sigmoid, 2.0 if neg_eigval else 1.0, delta, chunked,
            ptr(C.view(workspace, "workspace")) if workspace is not None else 0, variant, qa.stream(), device)
    C.run_later(later)  # (a check of cu_seqlens left for now gives `longest` here: the token loop may take the call)
    b.module.gated(*head, *(longest or _UNKNOWN), *tail)
    finish(b, qa)
    _fast.enable(b, qa.kind)


def _tree_without_states(op: str, indices_name: str):
    raise ValueError(f"cula.{op}: retrieve_parent_token needs the state after every token kept: {indices_name} "
                     "of shape [N, S] or inplace_final_state=False")


def _layout(v_first: bool) -> str:
    return "[N, H, V, K]" if v_first else "[N, H, K, V]"


def pool_mode(op, initial_state, output_final_state, inplace_final_state, ssm_state_indices, num_accepted_tokens):
    """vLLM's pool keywords, checked before the arrays: None without ssm_state_indices, else
    whether the states go back to the pool (inplace_final_state, default True) or one per token."""
    if ssm_state_indices is None:
        if num_accepted_tokens is not None:
            raise ValueError(f"cula.{op}: num_accepted_tokens needs ssm_state_indices")
        if inplace_final_state:
            raise ValueError(f"cula.{op}: inplace_final_state=True needs ssm_state_indices (the pool slots)")
        return None
    in_place = True if inplace_final_state is None else C.check_flag(inplace_final_state, "inplace_final_state")
    if output_final_state:
        raise ValueError(f"cula.{op}: with ssm_state_indices the states go to the pool (inplace_final_state) "
                         "or one per token; output_final_state must be False")
    if initial_state is None:
        raise ValueError(f"cula.{op}: ssm_state_indices needs initial_state, the [P, HV, K, V] state pool")
    return in_place


def chunk_pool_mode(op, initial_state, output_final_state, inplace_update, initial_state_indices):
    """SGLang's pool keywords of the chunk ops, checked before the arrays: None without
    initial_state_indices, else whether the final states go back to the pool (inplace_update,
    default True) rather than to new [N, ..] states (output_final_state) or nowhere."""
    if initial_state_indices is None:
        if inplace_update is not None and inplace_update is not False:
            raise ValueError(f"cula.{op}: inplace_update=True needs initial_state_indices (the pool slots)")
        return None
    in_place = True if inplace_update is None else C.check_flag(inplace_update, "inplace_update")
    if in_place and output_final_state:
        raise ValueError(f"cula.{op}: with initial_state_indices and inplace_update=True the final states go to "
                         "the pool; output_final_state must be False (inplace_update=False returns them as "
                         "[N, HV, K, V])")
    if initial_state is None:
        raise ValueError(f"cula.{op}: initial_state_indices needs initial_state, the [P, HV, K, V] state pool")
    return in_place


def sequence_op(op, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, cu_seqlens,
                cu_seqlens_cpu=None, inplace_final_state=None, ssm_state_indices=None, num_accepted_tokens=None,
                delta=True, chunked=False, per_key=False, lower_bound=None, out=None, v_first=False,
                initial_state_indices=None, inplace_update=None, indices_name="ssm_state_indices",
                retrieve_parent_token=None, cache=None):
    """A prefill or recurrence over [B, T, ...] inputs (fixed-length or cu_seqlens): checks, then one
    launch; returns (o, final_state) as the ops do. delta=False: simple_gla with a per-token gate (no
    beta, q, k and v with the same heads). chunked=True (the chunk_* ops): the chunked kernel
    (native/kernels/common/chunk_gated.cuh), with SGLang's pool keywords (initial_state_indices,
    inplace_update: chunk_pool_mode); the token loop otherwise, also with vLLM's pool keywords.
    per_key=True: KDA's per-key gate g [B, T, HV, K] (chunked: KDA's own two-launch kernel), with
    its lower_bound gate (already checked). out: an array like v that receives o. v_first: the
    states (initial_state, the pool, the states returned) are [.., V, K]. indices_name: what messages
    call vLLM's ssm_state_indices (cula.sglang passes SGLang's name). The token loop's speculative
    verify: retrieve_parent_token [N, S] (an EAGLE tree: each token from its parent's state, kept
    per token in the pool slots [N, S], the per-token states or the cache); cache: SGLang's
    (intermediate_states_buffer, intermediate_state_indices, cache_steps), the state after each
    token also to the buffer, with a pool (ssm_state_indices [N]); without inplace_final_state the
    pool is then only read and no other states are kept."""
    b = backend()  # no backend: every op raises the same BackendError, whatever its arguments
    qa, ka, va = (C.check_gva_inputs if delta else C.check_inputs)(q, k, v, 4, "[B, T, H, K]")
    batch, total, heads, dim = qa.shape
    v_heads = va.shape[2]
    if total < 1:
        raise ValueError(f"cula.{op}: q must hold at least one token (T >= 1), got T={total}")
    scale = C.check_scale(scale, dim)
    C.check_flag(output_final_state, "output_final_state")
    l2norm = C.check_flag(use_qk_l2norm_in_kernel, "use_qk_l2norm_in_kernel")
    gates = gates_of(op, g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                     (batch, total, v_heads), "[B, T, HV]", dim if per_key else 0, lower_bound)
    if cu_seqlens is None and cu_seqlens_cpu is not None:
        raise ValueError(f"cula.{op}: cu_seqlens_cpu is given without cu_seqlens")
    unchecked = C.values_unchecked(qa)
    later = []  # the checks of values in device memory, run right before the launch (launch, C.run_later)
    longest = []  # the longest sequence's tokens, index and first row and the others' longest: the check's
    if cu_seqlens is None:
        ca, nseq, one = None, batch, False
    else:  # (unchecked: shape checks only, the kernel clamps the values)
        ca, nseq, one = C.check_seqlens(cu_seqlens, batch, total, cu_seqlens_cpu, later, longest, not unchecked)
        if unchecked and not longest:  # (no room kept in the workspace for what they might hold)
            longest.extend(_UNREAD)
    C.check_sequence_count(nseq, "B" if cu_seqlens is None else "len(cu_seqlens) - 1")
    state_shape = (nseq, v_heads, dim, dim)
    ia = aa_acc = None
    num_slots = pitch = 0
    in_place = (chunk_pool_mode(op, initial_state, output_final_state, inplace_update, initial_state_indices)
                if chunked else pool_mode(op, initial_state, output_final_state, inplace_final_state,
                                          ssm_state_indices, num_accepted_tokens))
    if in_place is None:
        ha = C.check_state(initial_state, "initial_state", state_shape, layout=_layout(v_first))
        ht_mode = HT_FINAL if output_final_state else HT_NONE
    else:  # initial_state is the pool, read (and written) at the slots
        ha, pitch = C.check_pool(initial_state, "initial_state", (-1, v_heads, dim, dim), in_place, _layout(v_first))
        num_slots = ha.shape[0]
        check = not unchecked
        if chunked:  # SGLang's extend: [N] slots
            ia = C.check_indices(initial_state_indices, nseq, num_slots, check, "initial_state_indices", later=later)
            ht_mode = HT_SLOT if in_place else HT_FINAL if output_final_state else HT_NONE
        else:  # vLLM's continuous batching: [N] slots, or [N, S] with the accepted tokens
            ia = C.check_indices(ssm_state_indices, nseq, num_slots, check, indices_name, matrix=True, later=later)
            if num_accepted_tokens is not None:
                if len(ia.shape) != 2:
                    raise ValueError(f"cula.{op}: num_accepted_tokens needs ssm_state_indices of shape [N, S]")
                aa_acc = C.check_indices(num_accepted_tokens, nseq, ia.shape[1] + 1, check, "num_accepted_tokens",
                                         later=later)
            ht_mode = (HT_SLOT_TOKEN if len(ia.shape) == 2 else HT_SLOT) if in_place else HT_TOKEN
    cache_arrays = pa = None
    if cache is not None:  # (SGLang's target verify, cula.sglang: a pool call)
        buf, buf_indices, steps = cache
        ba = C.check_cache(buf, "intermediate_states_buffer", v_heads, dim, steps,
                           "[C, steps, HV, V, K]" if v_first else "[C, steps, HV, K, V]")
        cache_arrays = (ba, C.check_indices(buf_indices, nseq, ba.shape[0], not unchecked,
                                            "intermediate_state_indices", later=later))
        if ht_mode == HT_TOKEN:
            ht_mode = HT_NONE
    if retrieve_parent_token is not None:
        if cache is None and ht_mode not in (HT_SLOT_TOKEN, HT_TOKEN):
            _tree_without_states(op, indices_name)
        pa = C.check_parents(retrieve_parent_token, nseq, not unchecked, later=later)
    arrays = {"q": qa, "k": ka, "v": va, "g": gates[0], "beta": gates[1], "A_log": gates[2], "dt_bias": gates[3],
              "initial_state": ha, "cu_seqlens": ca,
              ("initial_state_indices" if chunked else indices_name): ia, "num_accepted_tokens": aa_acc,
              "out": C.check_out(out, va) if out is not None else None, "retrieve_parent_token": pa}
    if cache_arrays is not None:
        arrays["intermediate_states_buffer"], arrays["intermediate_state_indices"] = cache_arrays
    C.check_no_grad(arrays)
    device = C.same_device(arrays)
    ca, ia, aa_acc, pa = (C.prepare(a) for a in (ca, ia, aa_acc, pa))
    if chunked:  # (the chunked kernels take contiguous rows; the token loop any row stride)
        qa, ka, va = (C.prepare(a) for a in (qa, ka, va))
        strides = (0, 0, 0)
    else:
        (qa, qs), (ka, ks), (va, vs) = (C.prepare_rows(a) for a in (qa, ka, va))
        strides = (qs, ks, vs)
    if cache_arrays is not None:
        cache_arrays = (cache_arrays[0], C.prepare(cache_arrays[1]))
    if in_place is None:  # (a pool is copied, or not, by check_pool)
        ha = C.prepare(ha)
    gates = tuple(C.prepare(a) for a in gates)
    variant = check_device(b, device)
    o = qa.empty(va.shape, va.dtype) if out is None else out
    oa = arrays["out"] or C.view(o, "o")
    if ht_mode == HT_FINAL:
        ht = qa.empty(state_shape, "float32")
    elif ht_mode == HT_TOKEN:
        ht = qa.empty((batch * total, v_heads, dim, dim), "float32")
    elif ht_mode in (HT_SLOT, HT_SLOT_TOKEN):
        ht = initial_state
    else:
        ht = None
    hta = C.view(ht, "final_state") if ht is not None else None
    seq = C.seq_args(ca, nseq, total, one)
    launch(b, device, variant, qa, ka, va, oa, gates, ha, hta, ht_mode, ia, aa_acc, num_slots, seq, batch * total,
           scale, l2norm, use_beta_sigmoid_in_kernel, allow_neg_eigval, delta, chunked,
           gate_mode(use_gate_in_kernel, lower_bound), lower_bound, per_key, later, longest, v_first, pitch,
           cache_arrays, pa, strides)
    return o, ht


def decode_op(op, q, k, v, g, beta, state, scale, state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel,
              use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, check_indices, out,
              delta=True, per_key=False, lower_bound=None, v_first=False, indices_name="state_indices"):
    """A decode step on a state pool in place (gated_delta_rule_decode; kda_decode: per_key=True;
    simple_gla_decode with a per-token gate: delta=False, no beta, q, k and v with the same heads;
    v_first: a [P, HV, V, K] pool). indices_name: what messages call state_indices."""
    b = backend()
    qa0 = C.view(q, "q")
    ndim = len(qa0.shape)
    if ndim not in (3, 4):
        raise ValueError(f"cula.{op}: q must have shape [N, H, K] or [N, T, H, K], got "
                         f"[{', '.join(map(str, qa0.shape))}]")
    check_inputs = C.check_gva_inputs if delta else C.check_inputs
    qa, ka, va = check_inputs(qa0, k, v, ndim, "[N, H, K]" if ndim == 3 else "[N, T, H, K]")
    n, tokens = qa.shape[0], (1 if ndim == 3 else qa.shape[1])
    v_heads, dim = va.shape[-2], qa.shape[-1]
    if tokens < 1:
        raise ValueError(f"cula.{op}: q must hold at least one token per sequence, got T={tokens}")
    C.check_sequence_count(n, "N")
    scale = C.check_scale(scale, dim)
    l2norm = C.check_flag(use_qk_l2norm_in_kernel, "use_qk_l2norm_in_kernel")
    C.check_flag(v_first, "state_v_first")
    gates = gates_of(op, g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                     va.shape[:-1], "[N, HV]" if ndim == 3 else "[N, T, HV]", dim if per_key else 0, lower_bound)
    sa, pitch = C.check_pool(state, "state", (n if state_indices is None else -1, v_heads, dim, dim), True,
                             _layout(v_first))
    if sa is None:
        raise TypeError(f"cula.{op}: state is required (the [P, HV, K, V] float32 state pool)")
    check = C.check_flag(check_indices, "check_indices") and not C.values_unchecked(qa)
    later = []  # (run right before the launch: launch, C.run_later)
    ia = C.check_indices(state_indices, n, sa.shape[0], check, indices_name, matrix=True, later=later)
    acc = None
    if ia is not None and len(ia.shape) == 2 and ia.shape[1] < tokens:
        raise ValueError(f"cula.{op}: {indices_name} [N, S] needs a slot per token (S >= T={tokens}), "
                         f"got S={ia.shape[1]}")
    if num_accepted_tokens is not None:
        if ia is None or len(ia.shape) != 2:
            raise ValueError(f"cula.{op}: num_accepted_tokens needs state_indices of shape [N, S]")
        acc = C.check_indices(num_accepted_tokens, n, ia.shape[1] + 1, check, "num_accepted_tokens", later=later)
    oa = C.check_out(out, va) if out is not None else None
    arrays = {"q": qa, "k": ka, "v": va, "g": gates[0], "beta": gates[1], "A_log": gates[2], "dt_bias": gates[3],
              "state": sa, "state_indices": ia, "num_accepted_tokens": acc, "out": oa}
    C.check_no_grad(arrays)
    device = C.same_device(arrays)
    ia, acc = C.prepare(ia), C.prepare(acc)
    (qa, qs), (ka, ks), (va, vs) = (C.prepare_rows(a) for a in (qa, ka, va))
    gates = tuple(C.prepare(a) for a in gates)
    variant = check_device(b, device)
    if oa is None:
        out = qa.empty(va.shape, va.dtype)
        oa = C.view(out, "o")
    mode = HT_SLOT_TOKEN if ia is not None and len(ia.shape) == 2 else HT_SLOT
    launch(b, device, variant, qa, ka, va, oa, gates, sa, sa, mode, ia, acc, sa.shape[0] if ia is not None else n,
            (0, False, n, tokens), n * tokens, scale, l2norm, use_beta_sigmoid_in_kernel, allow_neg_eigval, delta,
            False, gate_mode(use_gate_in_kernel, lower_bound), lower_bound, per_key, later, v_first=v_first,
            pitch=pitch, strides=(qs, ks, vs))
    return out


# The public ops of the delta-rule families (the gated delta rule, KDA: per_key) after their own
# option checks: while torch.compile traces, the family's custom op (cula/_torch.py, whose KDA ops
# take lower_bound after dt_bias); else the C fast path when it takes the call; else the Python path.

def chunk_call(op, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, use_gate, A_log, dt_bias,
               sigmoid, neg, cu_seqlens, cu_seqlens_cpu, per_key=False, lower_bound=None, v_first=False,
               initial_state_indices=None, inplace_update=None):
    """A chunk op; traced, its custom op, with a state pool (initial_state_indices) the one that
    declares the pool as mutated (inplace_update) or the one that only reads it."""
    pool = initial_state_indices is not None or inplace_update is not None
    if _torch.is_compiling():
        _torch.check_flags(output_final_state=output_final_state, use_qk_l2norm_in_kernel=l2norm,
                           use_beta_sigmoid_in_kernel=sigmoid, allow_neg_eigval=neg, use_gate_in_kernel=use_gate)
        scale, extra = _torch.check_scale(scale), (lower_bound,) if per_key else ()
        in_place = chunk_pool_mode(op, initial_state, output_final_state, inplace_update, initial_state_indices) \
            if pool else None
        if in_place is None:  # (inplace_update=False alone too: a plain call)
            return _torch.sequence(op, output_final_state, q, k, v, g, beta, scale, initial_state, output_final_state,
                                   l2norm, sigmoid, neg, v_first, cu_seqlens, cu_seqlens_cpu, use_gate, A_log,
                                   dt_bias, *extra)
        args = (q, k, v, g, beta, scale, initial_state, l2norm, sigmoid, neg, v_first, cu_seqlens, cu_seqlens_cpu,
                use_gate, A_log, dt_bias, *extra, initial_state_indices)
        if in_place:
            return _torch.call(op + "_pool", *args), initial_state
        return _torch.sequence(op + "_pool_read", output_final_state, *args, output_final_state)
    if not pool and _fast.gated_sequence is not None and cu_seqlens is None and cu_seqlens_cpu is None:
        r = _fast.gated_sequence(True, True, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm,
                                 sigmoid, neg, use_gate, A_log, dt_bias, per_key, lower_bound, v_first)
        if r is not None:
            return r
    return sequence_op(op, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, use_gate, A_log,
                       dt_bias, sigmoid, neg, cu_seqlens, cu_seqlens_cpu, chunked=True, per_key=per_key,
                       lower_bound=lower_bound, v_first=v_first, initial_state_indices=initial_state_indices,
                       inplace_update=inplace_update)


def recurrence_call(op, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, use_gate, A_log, dt_bias,
                    sigmoid, neg, cu_seqlens, inplace_final_state, ssm_state_indices, num_accepted_tokens,
                    per_key=False, lower_bound=None, out=None, v_first=False, indices_name="ssm_state_indices",
                    retrieve_parent_token=None, cache=None):
    """A fused_recurrent op; traced, with a state pool (ssm_state_indices) its custom op that declares
    the pool as mutated or the one returning a state per token (with a verify's cache: the one that
    declares the cache mutated), and out= a copy into out (a custom op's output may not alias its
    inputs). indices_name, retrieve_parent_token, cache: as sequence_op's."""
    if _torch.is_compiling():
        o, ht = _compiled_recurrence(op, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, use_gate,
                                     A_log, dt_bias, sigmoid, neg, v_first, cu_seqlens, inplace_final_state,
                                     ssm_state_indices, num_accepted_tokens, (lower_bound,) if per_key else (),
                                     retrieve_parent_token, cache)
        if out is None:
            return o, ht
        if out.shape != o.shape or out.dtype != o.dtype:
            raise ValueError(f"cula: out must have the shape and dtype of v {tuple(o.shape)} {o.dtype}, "
                             f"got {tuple(out.shape)} {out.dtype}")
        out.copy_(o)
        return out, ht
    if (_fast.gated_sequence is not None and cu_seqlens is None and ssm_state_indices is None and out is None
            and num_accepted_tokens is None and (inplace_final_state is None or inplace_final_state is False)
            and retrieve_parent_token is None and cache is None):
        r = _fast.gated_sequence(False, True, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm,
                                 sigmoid, neg, use_gate, A_log, dt_bias, per_key, lower_bound, v_first)
        if r is not None:
            return r
    return sequence_op(op, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, use_gate, A_log,
                       dt_bias, sigmoid, neg, cu_seqlens, None, inplace_final_state, ssm_state_indices,
                       num_accepted_tokens, per_key=per_key, lower_bound=lower_bound, out=out, v_first=v_first,
                       indices_name=indices_name, retrieve_parent_token=retrieve_parent_token, cache=cache)


def _compiled_recurrence(op, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, use_gate, A_log,
                         dt_bias, sigmoid, neg, v_first, cu_seqlens, inplace_final_state, ssm_state_indices,
                         num_accepted_tokens, extra, retrieve_parent_token, cache):
    _torch.check_flags(output_final_state=output_final_state, use_qk_l2norm_in_kernel=l2norm,
                       use_gate_in_kernel=use_gate, use_beta_sigmoid_in_kernel=sigmoid, allow_neg_eigval=neg)
    scale = _torch.check_scale(scale)
    in_place = pool_mode(op, initial_state, output_final_state, inplace_final_state, ssm_state_indices,
                         num_accepted_tokens)
    if in_place is None:
        if retrieve_parent_token is not None:  # (a cache comes with a pool: cula.sglang)
            _tree_without_states(op, "ssm_state_indices")
        return _torch.sequence(op, output_final_state, q, k, v, g, beta, scale, initial_state, output_final_state,
                               l2norm, sigmoid, neg, v_first, cu_seqlens, use_gate, A_log, dt_bias, *extra)
    args = (q, k, v, g, beta, scale, initial_state, l2norm, sigmoid, neg, v_first, cu_seqlens, use_gate, A_log, dt_bias,
            *extra, ssm_state_indices, num_accepted_tokens, retrieve_parent_token)
    if cache is not None:  # (SGLang's target verify: o; the pool written only in place)
        buf, buf_indices, steps = cache
        return _torch.call(op + "_cache", *args, in_place, buf, buf_indices, steps), None
    if in_place:
        return _torch.call(op + "_pool", *args), initial_state
    return _torch.sequence(op + "_per_token", True, *args)


def decode_call(op, q, k, v, g, beta, state, scale, state_indices, num_accepted_tokens, l2norm, use_gate, A_log,
                dt_bias, sigmoid, neg, check_indices, out, per_key=False, lower_bound=None, v_first=False,
                indices_name="state_indices"):
    if _torch.is_compiling():
        _torch.check_flags(use_qk_l2norm_in_kernel=l2norm, use_gate_in_kernel=use_gate,
                           use_beta_sigmoid_in_kernel=sigmoid, allow_neg_eigval=neg, check_indices=check_indices,
                           state_v_first=v_first)
        return _torch.decode(op, out, v, q, k, v, g, beta, state, _torch.check_scale(scale), state_indices,
                             num_accepted_tokens, l2norm, sigmoid, neg, v_first, use_gate, A_log, dt_bias,
                             *((lower_bound,) if per_key else ()), check_indices)
    if _fast.gated_decode is not None and num_accepted_tokens is None:
        o = _fast.gated_decode(True, q, k, v, g, beta, state, scale, state_indices,
                               C.fast_check_indices(check_indices, state_indices), l2norm, sigmoid, neg, use_gate,
                               A_log, dt_bias, out, per_key, lower_bound, v_first)
        if o is not None:
            return o
    return decode_op(op, q, k, v, g, beta, state, scale, state_indices, num_accepted_tokens, l2norm, use_gate, A_log,
                     dt_bias, sigmoid, neg, check_indices, out, per_key=per_key, lower_bound=lower_bound,
                     v_first=v_first, indices_name=indices_name)
