"""Lightning Attention: simple_gla with FLA's fixed per-head decay
``g_gamma[h] = -(8 / H) * (1 - layer_idx / num_layers) * h``."""

from __future__ import annotations

import os
from typing import Any

from . import _checks as C
from . import _fast, _torch
from ._common import fla_options as _fla_options
from ._loader import backend
from .simple_gla import chunk_simple_gla, fused_recurrent_simple_gla, simple_gla_decode

__all__ = ["chunk_lightning_attn", "fused_recurrent_lightning_attn", "lightning_attn_decode", "lightning_attn_g_gamma"]

_G_GAMMA_CACHE: dict = {}
# The same decays of torch tensors by (device index, H, layer_idx, num_layers): the lookup a serving
# loop's Lightning call makes first, without the array view (cleared in a forked child).
_G_GAMMA_TORCH: dict = {}
os.register_at_fork(after_in_child=_G_GAMMA_TORCH.clear)


def lightning_attn_g_gamma(heads: int, layer_idx: int, num_layers: int) -> list[float]:
    """FLA's Lightning Attention decay: ``g_gamma[h] = -(8 / H) * (1 - layer_idx / num_layers) * h``."""
    for name, val in (("layer_idx", layer_idx), ("num_layers", num_layers)):
        if isinstance(val, bool) or not isinstance(val, int):
            raise TypeError(f"cula: {name} must be an int, got {type(val).__name__}")
    if num_layers < 1 or not 0 <= layer_idx < num_layers:
        raise ValueError(f"cula: need 0 <= layer_idx < num_layers, got layer_idx={layer_idx}, num_layers={num_layers}")
    return [-(8.0 / heads) * (1.0 - layer_idx / num_layers) * h for h in range(heads)]


def _lightning_g_gamma(q: Any, heads_axis: int, layer_idx: int, num_layers: int):
    """The decay of Lightning Attention's layer as a float32 [H] array on q's device, made once
    per (library, device, H, layer) and process: serving loops call this on every step."""
    if type(q) is _fast.tensor and type(layer_idx) is int and type(num_layers) is int:
        try:
            g = _G_GAMMA_TORCH.get((q.get_device(), q.shape[heads_axis], layer_idx, num_layers))
        except IndexError:  # too few dimensions: the checks below say so
            g = None
        if g is not None:
            return g
    backend()
    qa = C.view(q, "q")
    if len(qa.shape) < 2:
        raise ValueError(f"cula: q must have shape [B, T, H, K], got [{', '.join(map(str, qa.shape))}]")
    heads = qa.shape[heads_axis]
    if type(layer_idx) is not int or type(num_layers) is not int:  # a bool must not find an int's entry
        lightning_attn_g_gamma(heads, layer_idx, num_layers)  # raises for what is no int
        layer_idx, num_layers = int(layer_idx), int(num_layers)
    key = (qa.kind, qa.device, heads, layer_idx, num_layers, os.getpid())
    g = _G_GAMMA_CACHE.get(key)
    if g is None:
        values = lightning_attn_g_gamma(heads, layer_idx, num_layers)
        if qa.device is None:  # let the op's own checks report the CPU array
            return None
        g = _G_GAMMA_CACHE[key] = qa.full((heads,), "float32", values)
        if qa.kind == "torch":
            _G_GAMMA_TORCH[(qa.device, heads, layer_idx, num_layers)] = g
    return g


def chunk_lightning_attn(q: Any, k: Any, v: Any, layer_idx: int, num_layers: int, scale: float | None = None,
                         initial_state: Any = None, output_final_state: bool = False, cu_seqlens: Any = None,
                         **kwargs: Any):
    """FLA's chunk_lightning_attn: chunk_simple_gla with the Lightning Attention decay."""
    if kwargs:  # (a call without options skips the checks' cost, part of the ~10 us host budget)
        _fla_options("chunk_lightning_attn", False, kwargs)
    if _torch.is_compiling():
        _torch.check_flags(output_final_state=output_final_state)
        return _torch.sequence("chunk_lightning_attn", output_final_state, q, k, v, layer_idx, num_layers,
                               _torch.check_scale(scale), initial_state, output_final_state, cu_seqlens)
    g = _lightning_g_gamma(q, 2, layer_idx, num_layers)
    return chunk_simple_gla(q, k, v, g_gamma=g, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def fused_recurrent_lightning_attn(q: Any, k: Any, v: Any, layer_idx: int, num_layers: int,
                                   scale: float | None = None, initial_state: Any = None,
                                   output_final_state: bool = False, reverse: bool = False, cu_seqlens: Any = None):
    """FLA's fused_recurrent_lightning_attn: fused_recurrent_simple_gla with the Lightning decay."""
    if _torch.is_compiling():
        if reverse:
            raise NotImplementedError("cula.fused_recurrent_lightning_attn: reverse=True is not supported")
        _torch.check_flags(output_final_state=output_final_state)
        return _torch.sequence("fused_recurrent_lightning_attn", output_final_state, q, k, v, layer_idx, num_layers,
                               _torch.check_scale(scale), initial_state, output_final_state, cu_seqlens)
    g = _lightning_g_gamma(q, 2, layer_idx, num_layers)
    return fused_recurrent_simple_gla(q, k, v, g_gamma=g, scale=scale, initial_state=initial_state,
                                      output_final_state=output_final_state, reverse=reverse, cu_seqlens=cu_seqlens)


def lightning_attn_decode(q: Any, k: Any, v: Any, state: Any, layer_idx: int, num_layers: int,
                          scale: float | None = None, state_indices: Any = None, check_indices: bool = True,
                          out: Any = None):
    """simple_gla_decode with the Lightning Attention decay."""
    if _torch.is_compiling():
        _torch.check_flags(check_indices=check_indices)
        return _torch.decode("lightning_attn_decode", out, v, q, k, v, state, layer_idx, num_layers,
                             _torch.check_scale(scale), state_indices, check_indices)
    g = _lightning_g_gamma(q, -2, layer_idx, num_layers)
    return simple_gla_decode(q, k, v, state, g_gamma=g, scale=scale, state_indices=state_indices,
                             check_indices=check_indices, out=out)
