"""vLLM's calls into its copy of FLA's kernels, with the same arguments: replace vLLM's import of

    from vllm.model_executor.layers.fla.ops import fused_sigmoid_gating_delta_rule_update

by ``from cula.vllm import fused_sigmoid_gating_delta_rule_update``. vLLM's other calls take cula's
FLA-named ops as they are: ``fused_recurrent_gated_delta_rule`` / ``fused_recurrent_kda`` with
``ssm_state_indices``, ``num_accepted_tokens`` and ``inplace_final_state``, ``chunk_gated_delta_rule``
and ``chunk_kda``. vLLM's state pools (slots in pages shared with the conv state) are used in place."""

from __future__ import annotations

from typing import Any

from . import _engines
from .gated_delta_rule import fused_recurrent_gated_delta_rule
from .kda import fused_recurrent_kda

__all__ = ["fused_sigmoid_gating_delta_rule_update"]


def fused_sigmoid_gating_delta_rule_update(A_log: Any, a: Any, b: Any, dt_bias: Any, q: Any, k: Any, v: Any,
                                           beta: float = 1.0, threshold: float = 20.0, scale: float | None = None,
                                           initial_state: Any = None, inplace_final_state: bool = True,
                                           cu_seqlens: Any = None, ssm_state_indices: Any = None,
                                           num_accepted_tokens: Any = None, use_qk_l2norm_in_kernel: bool = False,
                                           is_kda: bool = False):
    """vLLM's decode step (and speculative decode) with the gates computed in the kernel; returns
    ``(o, final_state)`` as vLLM's does.

    q, k ``[B, T, H, K]`` (B = 1 with ``cu_seqlens``), v ``[B, T, HV, V]``; a, b ``[B, T, HV]`` (or
    ``[T, HV]``): g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b); with ``is_kda`` the
    gate is per key (KDA): a ``[B, T, HV, K]`` (or ``[.., HV * K]``), dt_bias ``[HV, K]``.
    ``initial_state`` is the value-first pool ``[P, HV, V, K]`` float32 read at ``ssm_state_indices``
    (``[N]``, or ``[N, S]`` with ``num_accepted_tokens``: read the slot of the accepted prefix, write
    one slot per token; -1: padding). ``inplace_final_state=True`` writes the states back to the
    slots and returns the pool; ``False`` returns the state after every token, ``[T, HV, V, K]``.
    ``beta`` and ``threshold`` are the softplus's (1.0 and 20.0 only). The values of cu_seqlens and of
    the slots are checked on the host (a device-to-host copy) except during CUDA-graph capture and
    with ``CULA_CHECK_VALUES=0``.
    """
    _engines.check_softplus("vllm", beta, threshold, ("beta", "threshold"))
    g, b, kw = _engines.gating(A_log, a, b, dt_bias, q, v, scale, use_qk_l2norm_in_kernel, is_kda, cu_seqlens)
    op = fused_recurrent_kda if is_kda else fused_recurrent_gated_delta_rule
    return op(q=q, k=k, v=v, g=g, beta=b, initial_state=initial_state, inplace_final_state=inplace_final_state,
              ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens, **kw)
