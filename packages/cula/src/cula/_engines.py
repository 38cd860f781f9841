"""What the serving-engine modules (cula.vllm, cula.sglang) share for the fused-gating call both
engines make, `fused_sigmoid_gating_delta_rule_update`: its gates computed in the kernel (g =
-exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)) on value-first state pools ([P, HV, V, K]),
mapped onto cula's ops. The engines' copies differ in their arguments' names and order and in what
they return."""

from __future__ import annotations

import math
from typing import Any

from . import _checks as C
from . import _torch
from ._gated import check_lower_bound

__all__ = ["check_softplus", "gating", "kda_lower_bound", "reshaped", "token_gates"]


def check_softplus(engine: str, beta: Any, threshold: Any, names: tuple[str, str]) -> None:
    """cula's in-kernel softplus is softplus(x) with beta 1, linear above 20: the engines' defaults."""
    if beta != 1.0 or threshold != 20.0:
        raise NotImplementedError(
            f"cula.{engine}.fused_sigmoid_gating_delta_rule_update: only {names[0]}=1.0 and {names[1]}=20.0 are "
            f"supported (cula's in-kernel softplus), got {names[0]}={beta!r}, {names[1]}={threshold!r}")


def reshaped(x: Any, shape: tuple[int, ...]) -> Any:
    """x seen as `shape` where it holds as many elements in another shape (the engines may pass a, b
    as [T, HV] beside [1, T, ..] inputs, and KDA's a as [.., HV * K]); else x, for cula's checks."""
    x_shape = tuple(getattr(x, "shape", ()))
    if x is None or x_shape == shape or math.prod(x_shape) != math.prod(shape):
        return x
    return x.reshape(shape)


def token_gates(a: Any, b: Any, shape: tuple[int, ...], key_dim: int) -> tuple[Any, Any]:
    """a and b as cula's ops take them (`shape`, [.., HV]; a per key with key_dim: [.., HV, K]),
    checked under the engines' names."""
    a_shape = (*shape, key_dim) if key_dim else shape
    a, b = reshaped(a, a_shape), reshaped(b, shape)
    if not _torch.is_compiling():  # (traced, the op's own checks run in its traced branch)
        C.check_token_scalars(a, "a", a_shape, "[B, T, HV, K]" if key_dim else "[B, T, HV]")
        C.check_token_scalars(b, "b", shape, "[B, T, HV]")
    return a, b


def kda_lower_bound(fn: str, is_kda: bool, lower_bound: Any) -> dict[str, Any]:
    """The KDA ops' lower_bound keyword for an engine's call `fn` ("engine.function"): none without
    one; checked as the KDA ops check it; refused without is_kda."""
    if lower_bound is None:
        return {}
    if not is_kda:
        raise ValueError(f"cula.{fn}: lower_bound is KDA's bounded gate; it needs is_kda=True")
    return {"lower_bound": check_lower_bound(fn, lower_bound)}


def gating(A_log: Any, a: Any, b: Any, dt_bias: Any, q: Any, v: Any, scale: Any, l2norm: bool, is_kda: bool,
           cu_seqlens: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(g, beta, the keywords) of the cula op for the call: a and b checked under their names and in
    the shapes cula takes, the gates in the kernel, value-first states."""
    a, b = token_gates(a, b, tuple(getattr(v, "shape", ()))[:-1], getattr(q, "shape", (0,))[-1] if is_kda else 0)
    kw = dict(scale=scale, use_qk_l2norm_in_kernel=l2norm, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
              use_beta_sigmoid_in_kernel=True, state_v_first=True, cu_seqlens=cu_seqlens)
    return a, b, kw
