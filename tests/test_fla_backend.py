"""cula as an FLA backend, on the CPU (FLA 0.6.0 with Triton installed, CPU torch): `import cula.fla`
puts cula in FLA's registries for the entry points cula implements; the verifiers decline what cula
does not take, with FLA's (accepted, reason); FLA_CULA=0 turns cula off. That FLA's entry points
then run cula's kernels is tests/gpu/test_fla_backend.py."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from inspect import unwrap

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore::cula.CulaBackendWarning", "ignore::UserWarning")


def test_without_fla_the_import_error_says_what_is_missing():
    code = "import sys; sys.modules['fla'] = None\ntry:\n import cula.fla\nexcept ImportError as e:\n print(e)"
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if not k.startswith("CULA_")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("cula.fla: FLA's backend registry (fla.backends, FLA 0.6.0 or newer"), out.stdout


try:
    with warnings.catch_warnings():  # (FLA's import warns about the CPU and torch.jit)
        warnings.simplefilter("ignore")
        import cula.fla
        import fla.backends as backends
        import fla.ops.kda as fla_kda
        import fla.ops.simple_gla as fla_sg
except ImportError as e:
    backends = None
    MISSING = f"FLA (fla-core 0.6.0 with Triton) is not installed: {e}"
needs_fla = pytest.mark.skipif(backends is None, reason=MISSING if backends is None else "")

ENTRIES = {
    "chunk_gated_delta_rule": lambda: backends._operation_registries["gated_delta_rule"],
    "fused_recurrent_kda_fwd": lambda: backends._operation_registries["kda"],
    "chunk_kda": lambda: backends._function_registries[unwrap(fla_kda.chunk_kda)],
    "fused_recurrent_simple_gla": lambda: backends._function_registries[unwrap(fla_sg.fused_recurrent_simple_gla)],
    "fused_chunk_simple_gla": lambda: backends._function_registries[unwrap(fla_sg.fused_chunk_simple_gla)],
    "parallel_simple_gla": lambda: backends._function_registries[unwrap(fla_sg.parallel_simple_gla)],
}


def cula_backend(entry):
    found = ENTRIES[entry]()._backends.get("cula")
    assert found is not None, f"cula is not registered for FLA's {entry}"
    return found


@needs_fla
def test_registered_for_each_entry_point():
    for entry in ENTRIES:
        b = cula_backend(entry)
        assert isinstance(b, cula.fla.CulaBackend) and b.priority == 4
        assert b.get_implementation(entry) is not None, entry


@needs_fla
def test_fla_cula_env_turns_it_off(monkeypatch):
    b = cula_backend("chunk_gated_delta_rule")
    monkeypatch.delenv("FLA_CULA", raising=False)
    assert b.is_available() and b.is_enabled()
    monkeypatch.setenv("FLA_CULA", "0")
    assert not b.is_enabled()


def _t(*shape, dtype=torch.bfloat16, grad=False):
    return torch.zeros(*shape, dtype=dtype, requires_grad=grad)


def _qkv(dim=64, dtype=torch.bfloat16, grad=False):
    return _t(1, 8, 2, dim, dtype=dtype, grad=grad), _t(1, 8, 2, dim, dtype=dtype), _t(1, 8, 2, dim, dtype=dtype)


G, BETA = _t(1, 8, 2, dtype=torch.float32), _t(1, 8, 2, dtype=torch.float32)
GK = _t(1, 8, 2, 64, dtype=torch.float32)  # KDA's per-key gate
DECLINED = [
    ("chunk_gated_delta_rule", lambda: (*_qkv(grad=True), G, BETA), {}, "requires grad"),
    ("chunk_gated_delta_rule", lambda: (*_qkv(dtype=torch.float32), G, BETA), {}, "bf16 or fp16"),
    ("chunk_gated_delta_rule", lambda: (*_qkv(dim=96), G, BETA), {}, "K = V in {64, 128}"),
    ("chunk_gated_delta_rule", lambda: (*_qkv(), G, BETA), {}, "CUDA tensors"),
    ("chunk_gated_delta_rule", lambda: (*_qkv(), G, BETA), {"state_v_first": True}, "CUDA tensors"),  # (taken)
    ("chunk_gated_delta_rule", lambda: (*_qkv(), G, BETA), {"cp_context": object()}, "cp_context"),
    ("chunk_gated_delta_rule", lambda: (*_qkv(), G, BETA), {"something_new": 1}, "something_new"),
    ("fused_recurrent_simple_gla", _qkv, {"reverse": True}, "reverse"),
    ("fused_recurrent_simple_gla", _qkv, {"g": G, "g_gamma": _t(2, dtype=torch.float32)}, "not both"),
    ("fused_recurrent_simple_gla", _qkv, {}, "CUDA tensors"),
    ("fused_chunk_simple_gla", lambda: _qkv(grad=True), {}, "requires grad"),
    ("parallel_simple_gla", _qkv, {"output_attentions": True}, "output_attentions"),
    ("parallel_simple_gla", _qkv, {}, "CUDA tensors"),
    ("chunk_kda", lambda: (*_qkv(), GK, BETA), {"state_v_first": True}, "CUDA tensors"),
    ("chunk_kda", lambda: (*_qkv(), GK, BETA), {"return_intermediate_states": True}, "return_intermediate_states"),
    ("chunk_kda", lambda: (*_qkv(), GK, BETA), {"something_new": 1}, "something_new"),
    ("chunk_kda", lambda: (*_qkv(grad=True), GK, BETA), {}, "requires grad"),
    ("chunk_kda", lambda: (*_qkv(), GK, BETA), {"safe_gate": True, "lower_bound": -5.0}, "CUDA tensors"),
    ("fused_recurrent_kda_fwd", lambda: (*_qkv(), GK, BETA), {}, "only into a pool"),
    ("fused_recurrent_kda_fwd", lambda: (*_qkv(), GK, BETA), {"inplace_final_state": False, "state_v_first": True},
     "CUDA tensors"),
    ("fused_recurrent_kda_fwd", lambda: (*_qkv(), GK, BETA), {"inplace_final_state": False, "something_new": 1},
     "something_new"),
    ("fused_recurrent_kda_fwd", lambda: (*_qkv(), GK, BETA),
     {"ssm_state_indices": _t(8, dtype=torch.int32), "inplace_final_state": False}, "packed as v"),
    ("fused_recurrent_kda_fwd", lambda: (*_qkv(), GK, BETA), {"inplace_final_state": False}, "CUDA tensors"),
]


@needs_fla
@pytest.mark.parametrize("entry, args, kwargs, reason", DECLINED)
def test_verifier_declines(entry, args, kwargs, reason):
    accepted, why = cula_backend(entry).verify(entry, *args(), **kwargs)
    assert not accepted and reason in why, why


@needs_fla
def test_grad_mode_off_is_not_declined_for_grad():
    """Inputs that require grad under torch.no_grad() need no backward: only the CPU device declines."""
    with torch.no_grad():
        accepted, why = cula_backend("chunk_gated_delta_rule").verify("chunk_gated_delta_rule", *_qkv(grad=True), G,
                                                                      BETA)
    assert not accepted and "CUDA tensors" in why, why
