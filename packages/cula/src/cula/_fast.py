"""The extension's fast path for torch tensors (native/src/fastpath.h), which every family's ops
try first: the checks of the plain case and the launch in one C call. Its entry points are set up
after the first call that the Python path completes with torch tensors (never with
CULA_NO_FAST_PATH set) and stay None until then; each answers None for whatever it does not take,
and the op then runs its Python path, which copies, converts or raises the error naming the
argument."""

from __future__ import annotations

import os
import sys

__all__ = ["decode", "enable", "gated_decode", "gated_sequence", "sequence", "tensor"]

tensor = None  # torch.Tensor, once on
decode = None  # simple_gla: fast_decode (simple_gla_fastpath.cpp)
sequence = None  # simple_gla: fast_sequence
gated_sequence = None  # gated delta rule, KDA, simple_gla with g: fast_gated_sequence (gated_delta_rule_fastpath.cpp)
gated_decode = None  # fast_gated_decode


def enable(b, kind: str) -> None:
    """From an op's Python path, after its launch: turns the fast path on for torch tensors."""
    global tensor, decode, sequence, gated_sequence, gated_decode
    if kind != "torch" or decode is not None or os.environ.get("CULA_NO_FAST_PATH"):
        return
    torch = sys.modules["torch"]
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw_stream is None:  # a torch without it keeps the Python path
        return
    b.module.fast_setup(torch.Tensor, torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64,
                        raw_stream, torch.empty_like, b)
    m = b.module
    # (getattr: a backend older than the selector has the simple_gla entry points only)
    gated_sequence, gated_decode = getattr(m, "fast_gated_sequence", None), getattr(m, "fast_gated_decode", None)
    tensor, decode, sequence = torch.Tensor, m.fast_decode, m.fast_sequence  # last: `decode` tells all are on
