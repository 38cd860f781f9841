"""Every op of every kernel family, as ``fla.ops`` gathers FLA's: each family lives in its own
module (``cula.simple_gla``, ``cula.lightning_attn``, ``cula.gated_delta_rule``, ``cula.kda``)."""

from __future__ import annotations

from .gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, gated_delta_rule_decode
from .kda import chunk_kda, fused_recurrent_kda, kda_decode
from .lightning_attn import (
    chunk_lightning_attn,
    fused_recurrent_lightning_attn,
    lightning_attn_decode,
    lightning_attn_g_gamma,
)
from .simple_gla import chunk_simple_gla, fused_recurrent_simple_gla, simple_gla_decode

__all__ = [
    "chunk_simple_gla",
    "fused_recurrent_simple_gla",
    "simple_gla_decode",
    "chunk_lightning_attn",
    "fused_recurrent_lightning_attn",
    "lightning_attn_decode",
    "lightning_attn_g_gamma",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "gated_delta_rule_decode",
    "chunk_kda",
    "fused_recurrent_kda",
    "kda_decode",
]
