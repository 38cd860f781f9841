"""The gated delta rule (Gated DeltaNet: Qwen3-Next, Qwen3.5): FLA-compatible entry points and a
serving decode step that updates a state pool in place, one or several (speculative) tokens per
sequence.

Per sequence and value head, with S a [K, V] float32 state, for each token t:
``S' = exp(g_t) S``, ``S = S' + beta_t k_t (v_t - S'^T k_t)^T``, ``o_t = scale S^T q_t``.

Layouts follow FLA: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]`` (HV a multiple of H: grouped value
heads), g and beta ``[B, T, HV]`` (float32, bfloat16 or float16), states ``[N, HV, K, V]`` float32,
or ``[N, HV, V, K]`` with ``state_v_first=True`` (FLA's option; SGLang's pools are laid out so).
"""

from __future__ import annotations

from typing import Any

from ._common import gated_options
from ._gated import chunk_call, decode_call, recurrence_call

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "gated_delta_rule_decode"]


def _gdn_options(op: str, state_v_first: Any, kwargs: dict) -> tuple[dict, bool]:
    """FLA's keyword options of the gated delta rule: the in-kernel gate's (use_gate_in_kernel, A_log,
    dt_bias, which FLA's chunk_gated_delta_rule takes through **kwargs), chunk_size (16, 32 or 64;
    it tunes FLA's kernels, not the result), head_first=False, and the state layout."""
    gate = {name: kwargs.pop(name) for name in ("use_gate_in_kernel", "A_log", "dt_bias") if name in kwargs}
    return gate, gated_options(op, state_v_first, kwargs, (16, 32, 64), "the gated delta rule")


_NO_OPTIONS: tuple = ({}, False)  # (read only) the in-kernel gate's options and the layout of a plain call


def chunk_gated_delta_rule(q: Any, k: Any, v: Any, g: Any, beta: Any, scale: float | None = None,
                           initial_state: Any = None, output_final_state: bool = False,
                           use_qk_l2norm_in_kernel: bool = False, use_beta_sigmoid_in_kernel: bool = False,
                           allow_neg_eigval: bool = False, state_v_first: bool = False, cu_seqlens: Any = None,
                           cu_seqlens_cpu: Any = None, chunk_indices: Any = None, cp_context: Any = None, *,
                           initial_state_indices: Any = None, inplace_update: bool | None = None, **kwargs: Any):
    """Prefill; returns ``(o, final_state)`` (final_state is None unless requested). FLA 0.6.0's
    signature; ``use_gate_in_kernel``, ``A_log`` and ``dt_bias`` come through ``**kwargs`` as in FLA.
    ``chunk_indices`` (FLA's precomputed varlen chunk table) is accepted and not needed.

    Plus the keywords of SGLang's extend call (its own copy of this op), for a state pool:
    ``initial_state_indices`` ([N] int32/int64) makes ``initial_state`` the ``[P, HV, K, V]`` pool
    (``[P, HV, V, K]`` with ``state_v_first=True``, SGLang's layout): sequence n starts from slot
    ``initial_state_indices[n]``; -1 marks a padding sequence (zero output, no state touched). With
    ``inplace_update`` (default True) its final state goes back to that slot and the pool is returned
    as final_state; ``inplace_update=False`` leaves the pool alone (final_state: new ``[N, ..]``
    states with ``output_final_state=True``, else None). The chunked kernels run on a key-first copy
    of the sequences' states in the workspace (gathered before, scattered after).

    Runs the chunked prefill (64-token chunks, the delta rule's triangular solve per chunk): one
    launch that walks each sequence's chunks, or, where that would leave SMs idle (one long prompt,
    few value heads per GPU), two launches (the chunks' state-independent products first, in
    parallel, into a workspace of about 1.1 KB per token and value head at K = V = 128; then the walk),
    or one long prompt split into segments run side by side (alone, or the longest sequence of a
    varlen call whose cu_seqlens the host checks, where it has at least twice the tokens of any other).
    Inputs whose longest sequence is 6 tokens or fewer run the token loop of
    fused_recurrent_gated_delta_rule instead, the faster there (``CULA_CHUNK_TOKEN_LOOP=0`` keeps the
    chunked kernels; while a CUDA graph is captured without cu_seqlens_cpu, the lengths are not read
    and all the tokens count).
    """
    if cp_context is not None:
        raise NotImplementedError("cula.chunk_gated_delta_rule: context parallelism (cp_context) is not supported")
    gate, v_first = _gdn_options("chunk_gated_delta_rule", state_v_first, kwargs) \
        if kwargs or state_v_first is not False else _NO_OPTIONS
    return chunk_call("chunk_gated_delta_rule", q, k, v, g, beta, scale, initial_state, output_final_state,
                      use_qk_l2norm_in_kernel, gate.get("use_gate_in_kernel", False), gate.get("A_log"),
                      gate.get("dt_bias"), use_beta_sigmoid_in_kernel, allow_neg_eigval, cu_seqlens, cu_seqlens_cpu,
                      v_first=v_first, initial_state_indices=initial_state_indices, inplace_update=inplace_update)


def fused_recurrent_gated_delta_rule(q: Any, k: Any, v: Any, g: Any = None, gk: Any = None, gv: Any = None,
                                     beta: Any = None, scale: float | None = None, initial_state: Any = None,
                                     output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                                     use_gate_in_kernel: bool = False, A_log: Any = None, dt_bias: Any = None,
                                     use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                                     state_v_first: bool = False, cu_seqlens: Any = None, *,
                                     inplace_final_state: bool | None = None, ssm_state_indices: Any = None,
                                     num_accepted_tokens: Any = None, retrieve_parent_token: Any = None,
                                     **kwargs: Any):
    """Token-by-token recurrence; returns ``(o, final_state)``. FLA 0.6.0's signature, plus the
    keywords of vLLM's serving call (its own copy of this op):

    - ``ssm_state_indices`` ([N], or [N, S] with one slot per token): ``initial_state`` is then the
      ``[P, HV, K, V]`` state pool (``[P, HV, V, K]`` with ``state_v_first=True``);
      sequence n starts from slot ``ssm_state_indices[n, 0]``, or
      ``[n, num_accepted_tokens[n] - 1]`` (speculative decoding: the state after the accepted
      prefix); -1 marks a padding sequence (zero output, no state touched).
    - ``inplace_final_state`` (default True with indices): the state after token t goes to slot
      ``ssm_state_indices[n, t]`` ([N, S]) or, with [N] indices, the final state back to slot
      ``ssm_state_indices[n]``; the pool is returned as final_state. False: one state per token,
      ``[B*T, HV, K, V]``.
    - ``retrieve_parent_token`` ([N, S], EAGLE tree verification): token t >= 1 of sequence n starts
      from the state after token ``retrieve_parent_token[n, t]`` (< t; the root's entry, column 0, is
      not read) instead of token t-1's, read back from where that state went (its slot, or the
      per-token states); a negative parent keeps token t-1's.

    Values of cu_seqlens and indices are checked on the host (a device-to-host copy) except while a
    CUDA graph is being captured.
    """
    op = "fused_recurrent_gated_delta_rule"
    if gk is not None or gv is not None:
        raise NotImplementedError(f"cula.{op}: per-key (gk) and per-value (gv) gates are not supported; "
                                  "pass the scalar gate g [B, T, HV]")
    v_first = gated_options(op, state_v_first, kwargs) if kwargs or state_v_first is not False else False
    return recurrence_call(op, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                           use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                           cu_seqlens, inplace_final_state, ssm_state_indices, num_accepted_tokens, v_first=v_first,
                           retrieve_parent_token=retrieve_parent_token)


def gated_delta_rule_decode(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, scale: float | None = None,
                            state_indices: Any = None, num_accepted_tokens: Any = None,
                            use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                            A_log: Any = None, dt_bias: Any = None, use_beta_sigmoid_in_kernel: bool = False,
                            allow_neg_eigval: bool = False, check_indices: bool = True, out: Any = None,
                            state_v_first: bool = False):
    """One decode step for N sequences, the state pool updated in place.

    q, k ``[N, H, K]`` and v ``[N, HV, V]`` with g, beta ``[N, HV]`` (one token per sequence), or
    ``[N, T, ...]`` with g, beta ``[N, T, HV]`` (T tokens per sequence: speculative decoding).
    ``state`` (``[P, HV, K, V]`` float32; each slot contiguous, slots any multiple of 16 bytes apart,
    as in vLLM's pools) holds the states: without indices sequence n uses ``state[n]``; with
    ``state_indices`` [N] it reads and writes slot ``state_indices[n]``; with ``state_indices``
    [N, S] (S >= T) it reads slot ``state_indices[n, num_accepted_tokens[n] - 1]`` (column 0
    without num_accepted_tokens) and writes the state after token t to slot
    ``state_indices[n, t]``. Slot -1 marks a padding sequence (zero output, state untouched).
    Indices are range-checked on the host (one device-to-host copy) unless ``check_indices=False``;
    the kernel treats out-of-range slots as padding. ``out`` (shaped and typed like v, contiguous)
    receives o instead of a new array (serving loops, CUDA graphs). ``state_v_first=True``: the pool is
    ``[P, HV, V, K]`` (SGLang's layout). Returns o shaped like v.
    """
    return decode_call("gated_delta_rule_decode", q, k, v, g, beta, state, scale, state_indices, num_accepted_tokens,
                       use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                       allow_neg_eigval, check_indices, out, v_first=state_v_first)
