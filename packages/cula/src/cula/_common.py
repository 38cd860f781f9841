"""What the ops of every kernel family share: raw pointers, the backend's dtype enum, the finish of
a call on arrays of other libraries, and FLA's keyword options."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

__all__ = ["dtype_enum", "finish", "fla_options", "gated_options", "ptr"]


def ptr(a) -> int:
    return 0 if a is None else a.ptr


def dtype_enum(b, a):
    """The backend's dtype enum for an input array (bf16 or fp16, already checked)."""
    return b.module.DType.bf16 if a.dtype == "bfloat16" else b.module.DType.f16


def finish(b, qa) -> None:
    """Arrays of libraries other than torch and CuPy (generic DLPack) do not share a stream with
    cula, so the op returns only once its kernel has finished."""
    if qa.kind == "dlpack":
        b.module.synchronize_stream(0)


def fla_options(op: str, state_v_first: Any, kwargs: dict) -> None:
    """The options FLA 0.6.0 accepts besides the tensors, so that code written for FLA runs
    unchanged: chunk_size only tunes FLA's own kernels (cula's result does not depend on it)."""
    if state_v_first is False and not kwargs:  # the common call, first
        return
    if state_v_first is not False:
        raise NotImplementedError(f"cula.{op}: state_v_first=True ([N, H, V, K] states) is not supported yet; "
                                  "states are [N, H, K, V]")
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in `[B, T, H, ...]` format.")
    if kwargs.get("transpose_state_layout"):
        raise NotImplementedError(f"cula.{op}: transpose_state_layout=True is not supported yet")
    chunk_size = kwargs.get("chunk_size")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1
                                   or chunk_size & (chunk_size - 1)):
        raise ValueError(f"cula.{op}: chunk_size must be a power of 2, got {chunk_size!r}")
    unknown = sorted(set(kwargs) - {"chunk_size", "transpose_state_layout"})
    if unknown:
        raise TypeError(f"cula.{op}() got unexpected keyword argument(s): {', '.join(unknown)}")


def _caller_level() -> int:
    """The stacklevel of a warning that its caller's caller issues: the first frame outside cula."""
    f, level = sys._getframe(1), 1
    while f.f_back is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _HERE:
        f, level = f.f_back, level + 1
    return level


_HERE = os.path.dirname(os.path.abspath(__file__))


def gated_options(op: str, state_v_first: Any, kwargs: dict, chunk_sizes: tuple[int, ...] = (),
                  family: str = "") -> bool:
    """fla_options of the gated families (the gated delta rule, KDA): head_first=False is accepted
    (vLLM's and SGLang's calls pass it; True raises in fla_options, as FLA raises), chunk_size must
    be one FLA's family takes (chunk_sizes, when given), and state_v_first (or its deprecated name,
    transpose_state_layout, with FLA's warning) is taken: returns it, True for [N, HV, V, K] states."""
    if kwargs.get("head_first") is False:
        kwargs.pop("head_first")
    if "transpose_state_layout" in kwargs:
        if state_v_first is not False:
            raise ValueError(f"cula.{op}: cannot pass both state_v_first and the deprecated transpose_state_layout")
        warnings.warn("transpose_state_layout is deprecated and renamed to state_v_first", DeprecationWarning,
                      stacklevel=_caller_level())
        state_v_first = kwargs.pop("transpose_state_layout")
    if not isinstance(state_v_first, bool):  # (isinstance: what torch.compile's tracing evaluates right)
        raise TypeError(f"cula.{op}: state_v_first must be a bool, got {type(state_v_first).__name__}")
    size = kwargs.get("chunk_size")
    if chunk_sizes and size is not None and size not in chunk_sizes:
        allowed = ", ".join(map(str, chunk_sizes[:-1])) + f" or {chunk_sizes[-1]}"
        raise ValueError(f"cula.{op}: chunk_size must be {allowed} for {family}, got {size!r}")
    fla_options(op, False, kwargs)
    return state_v_first
