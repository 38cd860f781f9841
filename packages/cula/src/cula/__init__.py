"""cula: CUDA linear-attention kernels for Hopper and Blackwell GPUs.

``pip install "cula[cu12]"`` or ``pip install "cula[cu13]"`` installs a backend; ``pip install cula``
alone installs this selector, which warns on import with the command that fits the machine.
``python -m cula`` prints what was found.
"""

from . import _torch
from ._loader import BackendError, CulaBackendWarning, warn_if_unusable
from ._version import __version__
from .ops import (
    chunk_gated_delta_rule,
    chunk_kda,
    chunk_lightning_attn,
    chunk_simple_gla,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_kda,
    fused_recurrent_lightning_attn,
    fused_recurrent_simple_gla,
    gated_delta_rule_decode,
    kda_decode,
    lightning_attn_decode,
    lightning_attn_g_gamma,
    simple_gla_decode,
)

__all__ = [
    "BackendError",
    "CulaBackendWarning",
    "__version__",
    "chunk_gated_delta_rule",
    "chunk_kda",
    "chunk_lightning_attn",
    "chunk_simple_gla",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_kda",
    "fused_recurrent_lightning_attn",
    "fused_recurrent_simple_gla",
    "gated_delta_rule_decode",
    "kda_decode",
    "lightning_attn_decode",
    "lightning_attn_g_gamma",
    "simple_gla_decode",
]

warn_if_unusable()
_torch.watch()  # torch.compile support: cula's custom ops, registered once torch is imported
