"""Kimi Delta Attention (KDA: Kimi Linear): FLA-compatible entry points (``chunk_kda``,
``fused_recurrent_kda``) and a serving decode step that updates a state pool in place, one or
several (speculative) tokens per sequence.

KDA is the gated delta rule with a per-key gate: per sequence and value head, with S a [K, V]
float32 state, for each token t (g_t a vector [K] of log decays):
``S' = diag(exp(g_t)) S``, ``S = S' + beta_t k_t (v_t - S'^T k_t)^T``, ``o_t = scale S^T q_t``.

Layouts follow FLA: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]`` (HV a multiple of H), g
``[B, T, HV, K]`` and beta ``[B, T, HV]`` (float32, bfloat16 or float16), states ``[N, HV, K, V]``
float32 (``[N, HV, V, K]`` with ``state_v_first=True``, as FLA). The in-kernel gate
(``use_gate_in_kernel``) is FLA's: ``-exp(A_log) softplus(g + dt_bias)`` with A_log ``[HV]`` and
dt_bias ``[HV * K]`` (or ``[HV, K]``), or with ``lower_bound``
``lower_bound * sigmoid(exp(A_log) (g + dt_bias))`` (``A_log`` may then be None: factor 1).

chunk_kda runs KDA's chunked kernels (native/kernels/common/chunk_kda.cuh), the other ops the
token-by-token recurrence (native/kernels/common/recurrence.cuh); so does chunk_kda when the longest
sequence is 12 tokens or fewer (read from cu_seqlens, except in CUDA-graph capture without
cu_seqlens_cpu: then all the tokens count), where one launch of the token loop is faster than the
chunked kernels' two (``CULA_CHUNK_TOKEN_LOOP=0`` keeps them). The chunked kernel takes the
diagonal 16-token blocks of a chunk to the tensor cores whenever their gates fit 16-bit operands
(always with a safe gate) and computes the others element by element, whatever ``safe_gate`` says:
``safe_gate`` changes nothing here but the checks of its lower bound.
"""

from __future__ import annotations

from typing import Any

from ._common import gated_options
from ._gated import check_lower_bound, chunk_call, decode_call, recurrence_call

__all__ = ["chunk_kda", "fused_recurrent_kda", "kda_decode"]


def _options(op: str, state_v_first: Any, kwargs: dict) -> bool:
    """FLA's keyword options besides the tensors (chunk_size 32 or 64 for KDA, as FLA); returns
    state_v_first."""
    return gated_options(op, state_v_first, kwargs, (32, 64), "KDA")


def _chunk_options(op, state_v_first, cp_context, return_intermediate_states, disable_recompute, use_graph,
                   max_num_seqs, kwargs) -> bool:
    if cp_context is not None:
        raise NotImplementedError(f"cula.{op}: context parallelism (cp_context) is not supported")
    if return_intermediate_states is not False:
        raise NotImplementedError(f"cula.{op}: return_intermediate_states=True (per-chunk states) is not supported")
    v_first = _options(op, state_v_first, kwargs)
    for name, value in (("disable_recompute", disable_recompute), ("use_graph", use_graph)):
        if not isinstance(value, bool):
            raise TypeError(f"cula.{op}: {name} must be a bool, got {type(value).__name__}")
    if max_num_seqs is not None and (isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int)):
        raise TypeError(f"cula.{op}: max_num_seqs must be an int or None, got {type(max_num_seqs).__name__}")
    return v_first


def chunk_kda(q: Any, k: Any, v: Any, g: Any, beta: Any, scale: float | None = None, initial_state: Any = None,
              output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
              use_gate_in_kernel: bool = False, use_beta_sigmoid_in_kernel: bool = False,
              allow_neg_eigval: bool = False, safe_gate: bool = False, lower_bound: float | None = None,
              disable_recompute: bool = False, return_intermediate_states: bool = False, state_v_first: bool = False,
              cu_seqlens: Any = None, cu_seqlens_cpu: Any = None, cp_context: Any = None, use_graph: bool = False,
              max_num_seqs: int | None = None, *, initial_state_indices: Any = None,
              inplace_update: bool | None = None, **kwargs: Any):
    """Prefill; returns ``(o, final_state)`` (final_state is None unless requested). FLA 0.6.0's
    signature; ``A_log`` and ``dt_bias`` come through ``**kwargs`` as in FLA.

    ``initial_state_indices`` and ``inplace_update`` are SGLang's pool keywords, as in
    chunk_gated_delta_rule: ``initial_state`` is then the ``[P, HV, K, V]`` pool (``[P, HV, V, K]``
    with ``state_v_first=True``), read at the slots and, by default, written back there.

    ``disable_recompute`` (a training option) is accepted and changes nothing; so are ``use_graph``
    and ``max_num_seqs`` (cula's ops are capturable in CUDA graphs as they are: pad cu_seqlens with
    empty sequences as FLA asks, they cost nothing). ``return_intermediate_states`` and
    ``cp_context`` raise NotImplementedError.
    """
    op = "chunk_kda"
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    v_first = False
    if (kwargs or state_v_first is not False or cp_context is not None or return_intermediate_states is not False
            or disable_recompute.__class__ is not bool or use_graph.__class__ is not bool
            or max_num_seqs is not None):  # (the checks of the options a plain call leaves at their defaults)
        v_first = _chunk_options(op, state_v_first, cp_context, return_intermediate_states, disable_recompute,
                                 use_graph, max_num_seqs, kwargs)
    lower_bound = check_lower_bound(op, lower_bound, safe_gate, use_gate_in_kernel)
    return chunk_call(op, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                      use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, cu_seqlens,
                      cu_seqlens_cpu, per_key=True, lower_bound=lower_bound, v_first=v_first,
                      initial_state_indices=initial_state_indices, inplace_update=inplace_update)


def fused_recurrent_kda(q: Any, k: Any, v: Any, g: Any, beta: Any, A_log: Any = None, dt_bias: Any = None,
                        scale: float | None = None, initial_state: Any = None, output_final_state: bool = False,
                        use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                        use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                        lower_bound: float | None = None, state_v_first: bool = False, cu_seqlens: Any = None, *,
                        inplace_final_state: bool | None = None, ssm_state_indices: Any = None,
                        num_accepted_tokens: Any = None, retrieve_parent_token: Any = None, out: Any = None,
                        **kwargs: Any):
    """Token-by-token recurrence; returns ``(o, final_state)``. FLA 0.6.0's signature, plus the
    keywords of vLLM's serving call (its own copy of this op):

    - ``ssm_state_indices`` ([N], or [N, S] with one slot per token): ``initial_state`` is then the
      ``[P, HV, K, V]`` state pool (``[P, HV, V, K]`` with ``state_v_first=True``);
      sequence n starts from slot ``ssm_state_indices[n, 0]``, or
      ``[n, num_accepted_tokens[n] - 1]`` (speculative decoding); -1 marks a padding sequence (zero
      output, no state touched).
    - ``inplace_final_state`` (default True with indices): the state after token t goes to slot
      ``ssm_state_indices[n, t]`` ([N, S]) or, with [N] indices, the final state back to slot
      ``ssm_state_indices[n]``; the pool is returned as final_state. False: one state per token,
      ``[B*T, HV, K, V]``.
    - ``retrieve_parent_token`` ([N, S], EAGLE tree verification): token t >= 1 of sequence n starts
      from the state after token ``retrieve_parent_token[n, t]`` (< t; the root's entry, column 0, is
      not read) instead of token t-1's, read back from where that state went (its slot, or the
      per-token states); a negative parent keeps token t-1's.
    - ``out`` (shaped and typed like v, contiguous) receives o instead of a new array.

    Values of cu_seqlens and indices are checked on the host (a device-to-host copy) except while a
    CUDA graph is being captured.
    """
    op = "fused_recurrent_kda"
    v_first = _options(op, state_v_first, kwargs) if kwargs or state_v_first is not False else False
    lower_bound = check_lower_bound(op, lower_bound)
    return recurrence_call(op, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                           use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                           cu_seqlens, inplace_final_state, ssm_state_indices, num_accepted_tokens, per_key=True,
                           lower_bound=lower_bound, out=out, v_first=v_first,
                           retrieve_parent_token=retrieve_parent_token)


def kda_decode(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, scale: float | None = None,
               state_indices: Any = None, num_accepted_tokens: Any = None, use_qk_l2norm_in_kernel: bool = False,
               use_gate_in_kernel: bool = False, A_log: Any = None, dt_bias: Any = None,
               lower_bound: float | None = None, use_beta_sigmoid_in_kernel: bool = False,
               allow_neg_eigval: bool = False, check_indices: bool = True, out: Any = None,
               state_v_first: bool = False):
    """One decode step for N sequences, the state pool updated in place: ``gated_delta_rule_decode``
    (its pool slots, speculative tokens, index checks and ``out``) with KDA's per-key gate, g
    ``[N, HV, K]`` (or ``[N, T, HV, K]``), and its gate options; ``state_v_first=True``: the pool is
    ``[P, HV, V, K]`` (SGLang's layout). Returns o shaped like v.
    """
    op = "kda_decode"
    lower_bound = check_lower_bound(op, lower_bound)
    return decode_call(op, q, k, v, g, beta, state, scale, state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel,
                       use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, check_indices,
                       out, per_key=True, lower_bound=lower_bound, v_first=state_v_first)
