"""Linear attention with a per-head scalar decay: FLA-compatible ``simple_gla`` entry points and a
serving decode step that updates a state pool in place.

Layouts follow FLA: q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, states ``[N, H, K, V]`` float32,
``g_gamma`` ``[H]`` float32 log decay (<= 0 decays). With ``cu_seqlens`` (``[N+1]``, int32 or
int64) B must be 1 and the N sequences are packed along T.
"""

from __future__ import annotations

from typing import Any

from . import _checks as C
from . import _fast, _gated, _torch
from ._common import dtype_enum as _dtype
from ._common import finish as _finish
from ._common import fla_options as _fla_options
from ._common import ptr as _ptr
from ._loader import backend, check_device

__all__ = ["chunk_simple_gla", "fused_recurrent_simple_gla", "simple_gla_decode"]


def _sequence_args(q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens, op,
                   cu_seqlens_cpu=None):
    b = backend()  # no backend: every op raises the same BackendError, whatever its arguments
    qa, ka, va = C.check_inputs(q, k, v, 4, "[B, T, H, K]")
    batch, total, heads, dim = qa.shape
    if total < 1:
        raise ValueError(f"cula.{op}: q must hold at least one token (T >= 1), got T={total}")
    scale = C.check_scale(scale, dim)
    ga = C.check_g_gamma(g_gamma, heads)
    if not isinstance(output_final_state, bool):
        raise TypeError(f"cula.{op}: output_final_state must be a bool, got {type(output_final_state).__name__}")
    if cu_seqlens is None and cu_seqlens_cpu is not None:
        raise ValueError(f"cula.{op}: cu_seqlens_cpu is given without cu_seqlens")
    later = []  # (the values of cu_seqlens, checked last: C.run_later; not while unchecked: the kernels clamp them)
    ca, nseq, one = (None, batch, False) if cu_seqlens is None else C.check_seqlens(
        cu_seqlens, batch, total, cu_seqlens_cpu, later, check_values=not C.values_unchecked(qa))
    C.check_sequence_count(nseq, "B" if cu_seqlens is None else "len(cu_seqlens) - 1")
    ha = C.check_state(initial_state, "initial_state", (nseq, heads, dim, dim))
    arrays = {"q": qa, "k": ka, "v": va, "g_gamma": ga, "initial_state": ha, "cu_seqlens": ca}
    C.check_no_grad(arrays)
    device = C.same_device(arrays)
    qa, ka, va, ha, ga, ca = (C.prepare(a) for a in (qa, ka, va, ha, ga, ca))
    variant = check_device(b, device)
    o = qa.empty(va.shape, va.dtype)
    ht = qa.empty((nseq, heads, dim, dim), "float32") if output_final_state else None
    seq = C.seq_args(ca, nseq, total, one)
    C.run_later(later)
    return b, variant, device, qa, ka, va, ga, ha, o, ht, seq, heads, dim, _dtype(b, qa), scale


def _fast_sequence(chunked, q, k, v, g, g_gamma, scale, initial_state, output_final_state):
    """The fast path of a fixed-length call: the per-head decay's, or the per-token gate's (the gated
    kernels); None when it does not take the call (g and g_gamma together among them)."""
    if g is None:
        return _fast.sequence(not chunked, q, k, v, g_gamma, scale, initial_state, output_final_state)
    if g_gamma is None and _fast.gated_sequence is not None:
        return _fast.gated_sequence(chunked, False, q, k, v, g, None, scale, initial_state, output_final_state,
                                    False, False, False, False, None, None, False, None, False)
    return None


def _per_token_gate(op, q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens,
                    cu_seqlens_cpu=None):
    """simple_gla with a per-token log decay g [B, T, H]: the gated kernels without the delta rule
    (native/kernels/common/chunk_gated.cuh for chunk_simple_gla, recurrence.cuh for the others)."""
    if g_gamma is not None:
        raise NotImplementedError(f"cula.{op}: g and g_gamma together are not supported; pass one of them")
    return _gated.sequence_op(op, q, k, v, g, None, scale, initial_state, output_final_state, False, False, None,
                              None, False, False, cu_seqlens, cu_seqlens_cpu, delta=False,
                              chunked=op == "chunk_simple_gla")


def chunk_simple_gla(q: Any, k: Any, v: Any, g: Any = None, g_gamma: Any = None, scale: float | None = None,
                     initial_state: Any = None, output_final_state: bool = False, state_v_first: bool = False,
                     cu_seqlens: Any = None, cu_seqlens_cpu: Any = None, **kwargs: Any):
    """Chunked prefill; returns ``(o, final_state)`` (final_state is None unless requested).

    FLA 0.6.0's signature. ``cu_seqlens_cpu`` (a host copy of ``cu_seqlens``) spares the
    device-to-host copy that validating ``cu_seqlens`` otherwise costs.
    """
    _fla_options("chunk_simple_gla", state_v_first, kwargs)  # (returns at once for a call without options)
    if _torch.is_compiling():
        _torch.check_flags(output_final_state=output_final_state)
        return _torch.sequence("chunk_simple_gla", output_final_state, q, k, v, g, g_gamma, _torch.check_scale(scale),
                               initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu)
    if _fast.sequence is not None and cu_seqlens is None and cu_seqlens_cpu is None:
        r = _fast_sequence(True, q, k, v, g, g_gamma, scale, initial_state, output_final_state)
        if r is not None:
            return r
    if g is not None:
        return _per_token_gate("chunk_simple_gla", q, k, v, g, g_gamma, scale, initial_state, output_final_state,
                               cu_seqlens, cu_seqlens_cpu)
    b, variant, device, qa, ka, va, ga, ha, o, ht, seq, heads, dim, dtype, scale = _sequence_args(
        q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens, "chunk_simple_gla",
        cu_seqlens_cpu)
    oa = C.view(o, "o")
    hta = C.view(ht, "final_state") if ht is not None else None
    # Sequences too few for the GPU are cut into pieces; the pieces' own states go to a scratch buffer.
    parts, part_len = b.module.chunk_split(seq[0] != 0, seq[2], seq[3], heads, dim, variant, device)
    scratch = C.view(qa.empty((seq[2] * (parts - 1) * heads * dim * dim,), "float32"), "scratch") if parts > 1 \
        else None
    b.module.chunk_simple_gla(qa.ptr, ka.ptr, va.ptr, oa.ptr, _ptr(ga), _ptr(ha), _ptr(hta), *seq,
                              qa.shape[0] * qa.shape[1], heads, dim, dtype, scale, parts, part_len, _ptr(scratch),
                              variant, qa.stream(), device)
    _finish(b, qa)
    _fast.enable(b, qa.kind)
    return o, ht


def fused_recurrent_simple_gla(q: Any, k: Any, v: Any, g: Any = None, g_gamma: Any = None,
                               scale: float | None = None, initial_state: Any = None,
                               output_final_state: bool = False, reverse: bool = False, state_v_first: bool = False,
                               cu_seqlens: Any = None, **kwargs: Any):
    """Token-by-token recurrence (FLA 0.6.0's fused_recurrent signature); returns ``(o, final_state)``."""
    _fla_options("fused_recurrent_simple_gla", state_v_first, kwargs)
    if reverse:
        raise NotImplementedError("cula.fused_recurrent_simple_gla: reverse=True is not supported")
    if _torch.is_compiling():
        _torch.check_flags(output_final_state=output_final_state)
        return _torch.sequence("fused_recurrent_simple_gla", output_final_state, q, k, v, g, g_gamma,
                               _torch.check_scale(scale), initial_state, output_final_state, cu_seqlens)
    if _fast.sequence is not None and cu_seqlens is None:
        r = _fast_sequence(False, q, k, v, g, g_gamma, scale, initial_state, output_final_state)
        if r is not None:
            return r
    if g is not None:
        return _per_token_gate("fused_recurrent_simple_gla", q, k, v, g, g_gamma, scale, initial_state,
                               output_final_state, cu_seqlens)
    b, _, device, qa, ka, va, ga, ha, o, ht, seq, heads, dim, dtype, scale = _sequence_args(
        q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens, "fused_recurrent_simple_gla")
    oa = C.view(o, "o")
    hta = C.view(ht, "final_state") if ht is not None else None
    b.module.recurrent_simple_gla(qa.ptr, ka.ptr, va.ptr, oa.ptr, _ptr(ga), _ptr(ha), _ptr(hta), 0, False, *seq,
                                  heads, dim, dtype, scale, qa.stream(), device, 0, 0, qa.shape[0] * qa.shape[1])
    _finish(b, qa)
    _fast.enable(b, qa.kind)
    return o, ht


def simple_gla_decode(q: Any, k: Any, v: Any, state: Any, g_gamma: Any = None, scale: float | None = None,
                      state_indices: Any = None, check_indices: bool = True, out: Any = None, g: Any = None):
    """One decode step for N sequences: q, k ``[N, H, K]`` (or ``[N, 1, H, K]``), v likewise.

    ``state`` (``[P, H, K, V]`` float32; each slot contiguous, any 16-byte pitch between slots, as
    vLLM's pools have) is updated in place: sequence n uses
    ``state[state_indices[n]]`` (``state[n]`` without indices; index -1 marks a padding slot,
    whose output is zero and whose state is untouched). Returns o shaped like v. The indices are
    range-checked on the host (one device-to-host copy); ``check_indices=False`` skips that copy,
    and the kernel then treats out-of-range indices as padding. ``out`` (shaped and typed like v,
    contiguous) receives o instead of a new array: serving loops and CUDA graphs reuse one buffer.
    ``g`` ([N, H], float32/bf16/fp16) is a per-token log decay in place of g_gamma.
    """
    if _torch.is_compiling():
        _torch.check_flags(check_indices=check_indices)
        return _torch.decode("simple_gla_decode", out, v, q, k, v, state, g_gamma, _torch.check_scale(scale),
                             state_indices, check_indices, g)
    if g is not None:
        if g_gamma is not None:
            raise NotImplementedError("cula.simple_gla_decode: g and g_gamma together are not supported; pass one "
                                      "of them")
        if _fast.gated_decode is not None:
            o = _fast.gated_decode(False, q, k, v, g, None, state, scale, state_indices,
                                   C.fast_check_indices(check_indices, state_indices), False, False, False, False,
                                   None, None, out, False, None, False)
            if o is not None:
                return o
        return _gated.decode_op("simple_gla_decode", q, k, v, g, None, state, scale, state_indices, None, False,
                                False, None, None, False, False, check_indices, out, delta=False)
    if _fast.decode is not None:
        o = _fast.decode(q, k, v, state, g_gamma, scale, state_indices,
                         C.fast_check_indices(check_indices, state_indices), out)
        if o is not None:
            return o
    b = backend()
    qa0 = C.view(q, "q")
    ndim = len(qa0.shape)
    if ndim not in (3, 4) or (ndim == 4 and qa0.shape[1] != 1):
        raise ValueError(f"cula.simple_gla_decode: q must have shape [N, H, K] or [N, 1, H, K], got "
                         f"[{', '.join(map(str, qa0.shape))}]")
    qa, ka, va = C.check_inputs(qa0, k, v, ndim, "[N, H, K]" if ndim == 3 else "[N, 1, H, K]")
    n, heads, dim = qa.shape[0], qa.shape[-2], qa.shape[-1]
    C.check_sequence_count(n, "N")
    scale = C.check_scale(scale, dim)
    ga = C.check_g_gamma(g_gamma, heads)
    sa, pitch = C.check_pool(state, "state", (n if state_indices is None else -1, heads, dim, dim), True)
    if sa is None:
        raise TypeError("cula.simple_gla_decode: state is required (the [P, H, K, V] float32 state pool)")
    if not isinstance(check_indices, bool):
        raise TypeError(f"cula.simple_gla_decode: check_indices must be a bool, got {type(check_indices).__name__}")
    later = []  # (the values of state_indices, checked last: C.run_later)
    ia = C.check_indices(state_indices, n, sa.shape[0], check_indices and not C.values_unchecked(qa), later=later)
    oa = C.check_out(out, va) if out is not None else None
    arrays = {"q": qa, "k": ka, "v": va, "g_gamma": ga, "state": sa, "state_indices": ia, "out": oa}
    C.check_no_grad(arrays)
    device = C.same_device(arrays)
    qa, ka, va, ga, ia = (C.prepare(a) for a in (qa, ka, va, ga, ia))
    check_device(b, device)
    if oa is None:
        out = qa.empty(va.shape, va.dtype)
        oa = C.view(out, "o")
    C.run_later(later)
    b.module.recurrent_simple_gla(qa.ptr, ka.ptr, va.ptr, oa.ptr, _ptr(ga), sa.ptr, sa.ptr, _ptr(ia),
                                  ia is not None and ia.dtype == "int64", 0, False, n, 1, heads, dim, _dtype(b, qa),
                                  scale, qa.stream(), device, sa.shape[0], pitch)
    _finish(b, qa)
    _fast.enable(b, qa.kind)
    return out
