"""cula as a drop-in for FLA 0.6.0: the same call, argument for argument, gives the same result
(both checked against the float64 reference). Skips where FLA is not installed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine", allow_module_level=True)
fla_gla = pytest.importorskip("fla.ops.simple_gla", reason="FLA (fla-core) is not installed")
fla_lightning = pytest.importorskip("fla.ops.lightning_attn", reason="FLA (fla-core) is not installed")

import cula  # noqa: E402
from cula._reference import rms_ratio, simple_gla_reference  # noqa: E402

TOL = 5e-3


def _inputs(batch, total, heads, dim, nseq):
    gen = torch.Generator(device="cuda").manual_seed(total)
    q = torch.randn(batch, total, heads, dim, device="cuda", generator=gen).bfloat16()
    k = (torch.randn(batch, total, heads, dim, device="cuda", generator=gen) * dim ** -0.5).bfloat16()
    v = torch.randn(batch, total, heads, dim, device="cuda", generator=gen).bfloat16()
    h0 = torch.randn(nseq, heads, dim, dim, device="cuda", generator=gen)
    return q, k, v, h0


CASES = {
    "fixed": dict(batch=2, total=300, nseq=2, cu=None),
    "varlen": dict(batch=1, total=600, nseq=3, cu=[0, 100, 357, 600]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", ["chunk_simple_gla", "fused_recurrent_simple_gla", "chunk_lightning_attn",
                                  "fused_recurrent_lightning_attn"])
def test_same_call_same_result(case, name):
    c = CASES[case]
    heads, dim = 4, 128
    q, k, v, h0 = _inputs(c["batch"], c["total"], heads, dim, c["nseq"])
    kwargs = dict(initial_state=h0, output_final_state=True)
    if c["cu"] is not None:
        kwargs["cu_seqlens"] = torch.tensor(c["cu"], device="cuda", dtype=torch.long)
    if "lightning" in name:
        args = (q, k, v, 2, 8)  # layer_idx, num_layers
        g = -(8 / heads * (1 - 2 / 8)) * torch.arange(heads, dtype=torch.float, device="cuda")
        fla_fn = getattr(fla_lightning, name)
    else:
        g = -torch.rand(heads, device="cuda") * 0.1
        args = (q, k, v)
        kwargs["g_gamma"] = g
        fla_fn = getattr(fla_gla, name)
    with torch.no_grad():
        o_fla, h_fla = fla_fn(*args, **kwargs)
        o_cula, h_cula = getattr(cula, name)(*args, **kwargs)
    torch.cuda.synchronize()
    ref_o, ref_h = simple_gla_reference(torch, q, k, v, g, None, h0, cu_seqlens=c["cu"])
    for who, o, h in (("FLA", o_fla, h_fla), ("cula", o_cula, h_cula)):
        assert o.shape == v.shape and o.dtype == v.dtype and h.shape == h0.shape and h.dtype == torch.float32
        e_o, e_h = rms_ratio(ref_o, o.double()), rms_ratio(ref_h, h.double())
        print(f"{name} {case} {who}: rms(o)={e_o:.1e} rms(state)={e_h:.1e}")
        assert e_o <= TOL and e_h <= TOL, f"{who}: rms(o)={e_o:.1e} rms(state)={e_h:.1e}"
