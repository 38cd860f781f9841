"""SGLang's calls into its copy of FLA's kernels, with the same arguments: replace SGLang's import of

    from sglang.srt.layers.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update)

by ``from cula.sglang import fused_sigmoid_gating_delta_rule_update``, and its decode fast path's
``fused_recurrent_gated_delta_rule_packed_decode`` / ``fused_recurrent_kda_packed_decode`` (from its
``fla.fused_recurrent``) by this module's. SGLang's extend call takes cula's
``chunk_gated_delta_rule`` / ``chunk_kda`` as they are (``initial_state_indices``, ``inplace_update``;
the pool value-first, ``state_v_first=True``)."""

from __future__ import annotations

from typing import Any

from . import _engines
from ._gated import check_lower_bound, decode_call, recurrence_call
from .gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from .kda import chunk_kda, fused_recurrent_kda

__all__ = ["fused_recurrent_gated_delta_rule_packed_decode", "fused_recurrent_kda_packed_decode",
           "fused_sigmoid_gating_delta_rule_update"]


def fused_sigmoid_gating_delta_rule_update(A_log: Any, a: Any, dt_bias: Any, softplus_beta: float,
                                           softplus_threshold: float, q: Any, k: Any, v: Any, b: Any,
                                           initial_state_source: Any, initial_state_indices: Any,
                                           scale: float | None = None, use_qk_l2norm_in_kernel: bool = False,
                                           cu_seqlens: Any = None, is_kda: bool = False,
                                           disable_state_update: bool = False, intermediate_states_buffer: Any = None,
                                           intermediate_state_indices: Any = None, cache_steps: int | None = None,
                                           retrieve_parent_token: Any = None, lower_bound: float | None = None):
    """SGLang's decode step, and its speculative target verify, with the gates computed in the
    kernel; returns o (shaped like v) as SGLang's does.

    q, k ``[B, T, H, K]`` (SGLang: ``[1, N, H, K]`` with ``cu_seqlens``), v ``[B, T, HV, V]``; a, b
    ``[B, T, HV]`` (or ``[T, HV]``): g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b); with
    ``is_kda`` the gate is per key (KDA): a ``[.., HV, K]`` or ``[.., HV * K]``, dt_bias ``[HV, K]``.
    ``initial_state_source`` is the value-first pool ``[P, HV, V, K]`` float32, read at
    ``initial_state_indices`` ``[N]`` (-1: padding, its o zero and nothing written) and written back
    there unless ``disable_state_update``. ``softplus_beta`` / ``softplus_threshold``: 1.0 and 20.0
    only.

    Target verify (the draft tokens of each sequence): ``intermediate_states_buffer``
    ``[C, cache_steps, HV, V, K]`` float32 (contiguous) receives the state after token t <
    ``cache_steps`` of sequence n at ``[intermediate_state_indices[n], t]`` (an index outside
    ``[0, C)``: none kept); with ``retrieve_parent_token`` ``[N, S]`` (an EAGLE tree, topk > 1) token
    t >= 1 starts from the state of its parent token ``retrieve_parent_token[n, t]`` (< t), read back
    from the buffer, instead of token t-1's.

    ``lower_bound`` (KDA only, newer SGLang): the bounded gate lower_bound sigmoid(exp(A_log)
    (a + dt_bias)) in place of the softplus one.
    """
    _engines.check_softplus("sglang", softplus_beta, softplus_threshold, ("softplus_beta", "softplus_threshold"))
    extra = _engines.kda_lower_bound("sglang.fused_sigmoid_gating_delta_rule_update", is_kda, lower_bound)
    cache = None
    if intermediate_states_buffer is not None or intermediate_state_indices is not None:
        if intermediate_states_buffer is None or intermediate_state_indices is None or initial_state_source is None:
            raise ValueError("cula.sglang.fused_sigmoid_gating_delta_rule_update: the target verify takes "
                             "intermediate_states_buffer, intermediate_state_indices and initial_state_source "
                             "(the pool) together")
        cache = (intermediate_states_buffer, intermediate_state_indices, cache_steps)
    elif retrieve_parent_token is not None:
        raise ValueError("cula.sglang.fused_sigmoid_gating_delta_rule_update: retrieve_parent_token needs "
                         "intermediate_states_buffer (where the tree's states are kept)")
    g, b, kw = _engines.gating(A_log, a, b, dt_bias, q, v, scale, use_qk_l2norm_in_kernel, is_kda, cu_seqlens)
    if initial_state_source is None:  # (zero states, none kept)
        op = fused_recurrent_kda if is_kda else fused_recurrent_gated_delta_rule
        return op(q=q, k=k, v=v, g=g, beta=b, **kw, **extra)[0]
    if disable_state_update and cache is None:  # the pool only read: the chunk ops keep no states
        op = chunk_kda if is_kda else chunk_gated_delta_rule
        return op(q, k, v, g, b, initial_state=initial_state_source, initial_state_indices=initial_state_indices,
                  inplace_update=False, **kw, **extra)[0]
    # (fused_recurrent_* with vLLM's keywords, the slots under SGLang's name in messages)
    return recurrence_call("fused_recurrent_kda" if is_kda else "fused_recurrent_gated_delta_rule", q, k, v, g, b,
                           scale, initial_state_source, False, use_qk_l2norm_in_kernel, True, A_log, dt_bias, True,
                           False, cu_seqlens, not disable_state_update, initial_state_indices, None, per_key=is_kda,
                           lower_bound=extra.get("lower_bound"),
                           v_first=True, indices_name="initial_state_indices",
                           retrieve_parent_token=retrieve_parent_token, cache=cache)[0]


def fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any,
                                                   scale: float | None, initial_state: Any, out: Any,
                                                   ssm_state_indices: Any, use_qk_l2norm_in_kernel: bool = False):
    """SGLang's decode fast path (its Triton GDN backend's ``packed_decode``): one token per request,
    q, k and v read where they lie in the packed projection ``mixed_qkv`` ``[B, 2 H K + HV V]`` (no
    copies: cula's token loop takes their row stride); a, b ``[B, HV]``, the gates computed in the
    kernel (as ``fused_sigmoid_gating_delta_rule_update``'s), A_log and dt_bias ``[HV]``; the
    value-first pool ``initial_state`` ``[P, HV, V, K]`` float32 read and written at
    ``ssm_state_indices`` ``[B]`` (-1: padding, its o zero); o into ``out`` ``[B, 1, HV, V]``
    (contiguous). Returns ``(out, initial_state)`` as SGLang's does."""
    return _packed_decode("fused_recurrent_gated_delta_rule_packed_decode", False, mixed_qkv, a, b, A_log, dt_bias,
                          scale, initial_state, out, ssm_state_indices, use_qk_l2norm_in_kernel)


def fused_recurrent_kda_packed_decode(mixed_qkv: Any, a: Any, b: Any, A_log: Any, dt_bias: Any,
                                      scale: float | None, initial_state: Any, out: Any, ssm_state_indices: Any,
                                      use_qk_l2norm_in_kernel: bool = False, lower_bound: float | None = None):
    """``fused_recurrent_gated_delta_rule_packed_decode`` with KDA's per-key gate (SGLang's Triton KDA
    backend): a ``[B, HV * K]`` (or ``[B, HV, K]``), dt_bias ``[HV * K]``, A_log ``[HV]``; with
    ``lower_bound`` (newer SGLang) the bounded gate lower_bound sigmoid(exp(A_log) (a + dt_bias))."""
    return _packed_decode("fused_recurrent_kda_packed_decode", True, mixed_qkv, a, b, A_log, dt_bias, scale,
                          initial_state, out, ssm_state_indices, use_qk_l2norm_in_kernel, lower_bound)


def _packed_decode(name, is_kda, mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                   l2norm, lower_bound=None):
    """The decode op (gated_delta_rule_decode / kda_decode with one token a sequence, [B, 1, ..];
    value-first pool, gates in the kernel) on views of mixed_qkv's rows, o straight into out."""
    pool_shape = tuple(getattr(initial_state, "shape", ()))
    if len(pool_shape) != 4:
        raise ValueError(f"cula.sglang.{name}: initial_state must be the [P, HV, V, K] state pool, got shape "
                         f"{list(pool_shape)}")
    heads_v, dim_v, dim = pool_shape[1:]
    if dim_v != dim:
        raise ValueError(f"cula.sglang.{name}: initial_state must be [P, HV, V, K] with K = V, got shape "
                         f"{list(pool_shape)}")
    shape = tuple(getattr(mixed_qkv, "shape", ()))
    qk = shape[1] - heads_v * dim if len(shape) == 2 else 0
    if qk <= 0 or qk % (2 * dim):
        raise ValueError(f"cula.sglang.{name}: mixed_qkv must have shape [B, 2 H K + HV V] with HV = {heads_v}, "
                         f"V = {dim_v}, K = {dim} (the pool's), got {list(shape)}")
    batch, heads = shape[0], qk // (2 * dim)
    q, k, v = mixed_qkv.reshape(batch, 1, -1, dim).split([heads, heads, heads_v], 2)  # (views: two torch calls)
    a, b = _engines.token_gates(a, b, (batch, 1, heads_v), dim if is_kda else 0)
    # (the decode op's path, the slots under SGLang's name in messages)
    decode_call("kda_decode" if is_kda else "gated_delta_rule_decode", q, k, v, a, b, initial_state, scale,
                ssm_state_indices, None, l2norm, True, A_log, dt_bias, True, False, True, out, per_key=is_kda,
                lower_bound=check_lower_bound("sglang." + name, lower_bound), v_first=True,
                indices_name="ssm_state_indices")
    return out, initial_state
