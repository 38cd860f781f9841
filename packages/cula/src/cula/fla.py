"""cula as a backend of FLA (flash-linear-attention 0.6.0): ``import cula.fla`` registers cula in
FLA's backend registry (``fla.backends.register``) for the FLA entry points that FLA dispatches
and cula implements, so that code calling FLA runs cula's kernels with no change:

- ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``
- ``fla.ops.kda.chunk_kda``, and ``fused_recurrent_kda_fwd`` (what ``fla.ops.kda.fused_recurrent_kda``
  runs; state pools in place as vLLM's copy of it takes them)
- ``fla.ops.simple_gla.fused_recurrent_simple_gla``, ``fused_chunk_simple_gla`` and
  ``parallel_simple_gla`` (the last two run cula's ``chunk_simple_gla``)

For each call a verifier decides: cula declines what it does not take (an input that needs a
gradient while grad mode is on, CPU tensors, dtypes other than bf16/fp16, K or V other than 64
or 128, FLA options cula lacks, a GPU cula does not support, no cula backend installed), and FLA
runs its own kernel for it. ``FLA_CULA=0`` turns the backend off (FLA's switch per backend, as
``FLA_FLASH_QLA=0`` for FlashQLA); ``FLA_DISABLE_BACKEND_DISPATCH=1`` turns off all of FLA's
backends. ``import cula`` itself never imports FLA: registration happens here, when asked.
"""

from __future__ import annotations

from typing import Any

try:
    import torch
    from fla.backends import BaseBackend, register
except ImportError as e:
    raise ImportError(f"cula.fla: FLA's backend registry (fla.backends, FLA 0.6.0 or newer: pip install "
                      f"'fla-core>=0.6.0') could not be imported: {e}") from e
from fla.ops import gated_delta_rule as _fla_gdn  # noqa: F401  (FLA's dispatch of these is set up on import)
from fla.ops.kda import chunk_kda
from fla.ops.simple_gla import fused_chunk_simple_gla, fused_recurrent_simple_gla, parallel_simple_gla

from . import ops
from ._loader import backend, check_device

__all__ = ["CulaBackend"]


def _decline(q: Any, k: Any, v: Any, *others: Any) -> tuple[bool, str | None]:
    """What every entry point needs: torch tensors, forward only, bf16 or fp16, K = V in {64, 128},
    on a CUDA GPU that cula supports. Returns FLA's (accepted, reason)."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return False, "cula takes torch tensors for q, k and v"
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, *others)):
        return False, "cula implements the forward pass only, and an input requires grad"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return False, f"cula takes bf16 or fp16 q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[-1] not in (64, 128) or v.shape[-1] != q.shape[-1]:
        return False, f"cula takes K = V in {{64, 128}}, got K={q.shape[-1]}, V={v.shape[-1]}"
    if q.device.type != "cuda":
        return False, f"cula runs on CUDA tensors, got {q.device}"
    check_device(backend(), q.device.index)  # raises (FLA's verify declines with the message) if not
    return True, None


class CulaBackend(BaseBackend):
    """cula's kernels (https://pypi.org/project/cula/) for FLA's dispatched entry points. Priority 4:
    after FlashQLA (3) where both are installed, before FLA's own Triton kernels."""

    backend_type = "cula"
    package_name = "cula"
    env_var = "FLA_CULA"
    default_enable = True
    priority = 4

    # The gated delta rule's entry points are dispatched by operation ('gated_delta_rule'): the
    # registry looks up methods named after them.
    def chunk_gated_delta_rule_verifier(self, q, k, v, g, beta, scale=None, initial_state=None,
                                        output_final_state=False, use_qk_l2norm_in_kernel=False,
                                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                        state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                                        chunk_indices=None, cp_context=None, **kwargs):
        if cp_context is not None:
            return False, "cula does not take cp_context"
        unknown = set(kwargs) - {"use_gate_in_kernel", "A_log", "dt_bias", "chunk_size", "head_first",
                                 "transpose_state_layout"}
        if unknown:
            return False, f"cula does not take {sorted(unknown)}"
        return _decline(q, k, v, g, beta, initial_state, kwargs.get("A_log"), kwargs.get("dt_bias"))

    def chunk_gated_delta_rule(self, *args, **kwargs):
        return ops.chunk_gated_delta_rule(*args, **kwargs)


    # KDA's token loop is dispatched by operation ('kda'), chunk_kda by function (below).
    def fused_recurrent_kda_fwd_verifier(self, q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None,
                                         scale=None, output_final_state=False, inplace_final_state=True,
                                         state_v_first=False, cu_seqlens=None, ssm_state_indices=None,
                                         num_accepted_tokens=None, use_qk_l2norm_in_kernel=False,
                                         use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                                         allow_neg_eigval=False, lower_bound=None, out=None, **kwargs):
        if kwargs:
            return False, f"cula does not take {sorted(kwargs)}"
        if ssm_state_indices is None and inplace_final_state:
            return False, "cula writes final states in place only into a pool (ssm_state_indices)"
        if ssm_state_indices is not None and not inplace_final_state:
            return False, "cula's states per token (inplace_final_state=False) are packed as v, not FLA's [N]"
        return _decline(q, k, v, g, beta, initial_state, A_log, dt_bias)

    def fused_recurrent_kda_fwd(self, q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                                output_final_state=False, inplace_final_state=True, state_v_first=False,
                                cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                                use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, out=None,
                                **kwargs):
        pool = ssm_state_indices is not None
        return ops.fused_recurrent_kda(
            q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state and not pool, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
            allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound, state_v_first=state_v_first,
            cu_seqlens=cu_seqlens, inplace_final_state=True if pool else None, ssm_state_indices=ssm_state_indices,
            num_accepted_tokens=num_accepted_tokens, out=out)


register("gated_delta_rule")(CulaBackend)
register("kda")(CulaBackend)


def _chunk_kda_verifier(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                        allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
                        return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                        cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
    if cp_context is not None or return_intermediate_states:
        return False, "cula does not take cp_context or return_intermediate_states"
    unknown = set(kwargs) - {"A_log", "dt_bias", "chunk_size", "head_first", "transpose_state_layout"}
    if unknown:
        return False, f"cula does not take {sorted(unknown)}"
    return _decline(q, k, v, g, beta, initial_state, kwargs.get("A_log"), kwargs.get("dt_bias"))


@register(chunk_kda, backend=CulaBackend, verifier=_chunk_kda_verifier)
def _chunk_kda(*args, **kwargs):
    return ops.chunk_kda(*args, **kwargs)


def _simple_gla_verifier(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                         reverse=False, state_v_first=False, cu_seqlens=None, **kwargs):
    if reverse or state_v_first or kwargs:
        return False, "cula does not take reverse, state_v_first or other options"
    if g is not None and g_gamma is not None:
        return False, "cula takes g or g_gamma, not both"
    return _decline(q, k, v, g, g_gamma, initial_state)


@register(fused_recurrent_simple_gla, backend=CulaBackend, verifier=_simple_gla_verifier)
def _fused_recurrent_simple_gla(*args, **kwargs):
    return ops.fused_recurrent_simple_gla(*args, **kwargs)


def _fused_chunk_verifier(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                          cu_seqlens=None):
    return _simple_gla_verifier(q, k, v, g, g_gamma, scale, initial_state, output_final_state)


@register(fused_chunk_simple_gla, backend=CulaBackend, verifier=_fused_chunk_verifier)
def _fused_chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                            cu_seqlens=None):
    return ops.chunk_simple_gla(q, k, v, g=g, g_gamma=g_gamma, scale=scale, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def _parallel_verifier(q, k, v, g=None, scale=None, output_attentions=False, cu_seqlens=None, cu_seqlens_cpu=None):
    if output_attentions:
        return False, "cula does not materialise the attention scores (output_attentions=True)"
    return _decline(q, k, v, g)


@register(parallel_simple_gla, backend=CulaBackend, verifier=_parallel_verifier)
def _parallel_simple_gla(q, k, v, g=None, scale=None, output_attentions=False, cu_seqlens=None, cu_seqlens_cpu=None):
    o, _ = ops.chunk_simple_gla(q, k, v, g=g, scale=scale, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    return o, None
