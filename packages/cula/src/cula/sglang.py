"""SGLang's calls into its copy of FLA's kernels, with the same arguments: replace SGLang's import of

    from sglang.srt.layers.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update)

by ``from cula.sglang import fused_sigmoid_gating_delta_rule_update``. SGLang's extend call takes
cula's ``chunk_gated_delta_rule`` / ``chunk_kda`` as they are (``initial_state_indices``,
``inplace_update``; the pool value-first, ``state_v_first=True``)."""

from __future__ import annotations

from typing import Any

from . import _engines
from ._gated import recurrence_call
from .gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from .kda import chunk_kda, fused_recurrent_kda

__all__ = ["fused_sigmoid_gating_delta_rule_update"]


def fused_sigmoid_gating_delta_rule_update(A_log: Any, a: Any, dt_bias: Any, softplus_beta: float,
                                           softplus_threshold: float, q: Any, k: Any, v: Any, b: Any,
                                           initial_state_source: Any, initial_state_indices: Any,
                                           scale: float | None = None, use_qk_l2norm_in_kernel: bool = False,
                                           cu_seqlens: Any = None, is_kda: bool = False,
                                           disable_state_update: bool = False, intermediate_states_buffer: Any = None,
                                           intermediate_state_indices: Any = None, cache_steps: int | None = None,
                                           retrieve_parent_token: Any = None):
    """SGLang's decode step with the gates computed in the kernel; returns o (shaped like v) as
    SGLang's does.

    q, k ``[B, T, H, K]`` (SGLang: ``[1, N, H, K]`` with ``cu_seqlens``), v ``[B, T, HV, V]``; a, b
    ``[B, T, HV]`` (or ``[T, HV]``): g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b); with
    ``is_kda`` the gate is per key (KDA): a ``[.., HV, K]`` or ``[.., HV * K]``, dt_bias ``[HV, K]``.
    ``initial_state_source`` is the value-first pool ``[P, HV, V, K]`` float32, read at
    ``initial_state_indices`` ``[N]`` (-1: padding, its o zero) and written back there unless
    ``disable_state_update``. ``softplus_beta`` / ``softplus_threshold``: 1.0 and 20.0 only. The
    target-verify options (``intermediate_states_buffer``, ``intermediate_state_indices``,
    ``cache_steps``, ``retrieve_parent_token``) raise NotImplementedError.
    """
    _engines.check_softplus("sglang", softplus_beta, softplus_threshold, ("softplus_beta", "softplus_threshold"))
    _engines.refuse("sglang", "the target-verify state caching and tree attention of SGLang's own kernel",
                    intermediate_states_buffer=intermediate_states_buffer,
                    intermediate_state_indices=intermediate_state_indices, cache_steps=cache_steps,
                    retrieve_parent_token=retrieve_parent_token)
    g, b, kw = _engines.gating(A_log, a, b, dt_bias, q, v, scale, use_qk_l2norm_in_kernel, is_kda, cu_seqlens)
    if initial_state_source is None:  # (zero states, none kept)
        op = fused_recurrent_kda if is_kda else fused_recurrent_gated_delta_rule
        return op(q=q, k=k, v=v, g=g, beta=b, **kw)[0]
    if disable_state_update:  # the pool only read: the chunk ops keep no states (the token loop for short ones)
        op = chunk_kda if is_kda else chunk_gated_delta_rule
        return op(q, k, v, g, b, initial_state=initial_state_source, initial_state_indices=initial_state_indices,
                  inplace_update=False, **kw)[0]
    # (fused_recurrent_* with vLLM's keywords, the slots under SGLang's name in messages)
    return recurrence_call("fused_recurrent_kda" if is_kda else "fused_recurrent_gated_delta_rule", q, k, v, g, b,
                           scale, initial_state_source, False, use_qk_l2norm_in_kernel, True, A_log, dt_bias, True,
                           False, cu_seqlens, True, initial_state_indices, None, per_key=is_kda, v_first=True,
                           indices_name="initial_state_indices")[0]
