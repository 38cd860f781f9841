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
    errors = {}
    for who, o, h in (("cula", o_cula, h_cula), ("FLA", o_fla, h_fla)):
        assert o.shape == v.shape and o.dtype == v.dtype and h.shape == h0.shape and h.dtype == torch.float32
        errors[who] = (rms_ratio(ref_o, o.double()), rms_ratio(ref_h, h.double()))
        print(f"{name} {case} {who}: rms(o)={errors[who][0]:.1e} rms(state)={errors[who][1]:.1e}")
    assert max(errors["cula"]) <= TOL, f"cula: rms(o), rms(state) = {errors['cula']}"
    if torch.isnan(h_fla).any() and not torch.isnan(h_cula).any():
        # Seen with FLA 0.6.0's chunk_lightning_attn: strong decays (g_gamma down to -4.5 per token
        # here) give NaN in its final state while its o is right; cula's state is right.
        assert errors["FLA"][0] <= TOL
        pytest.xfail(f"FLA's {name} returned NaN in the final state; cula matches the reference")
    assert max(errors["FLA"]) <= TOL, f"FLA: rms(o), rms(state) = {errors['FLA']}"
    # Same call, same answer: cula and FLA agree with each other as closely as with the reference.
    assert rms_ratio(o_fla.double(), o_cula.double()) <= 2 * TOL
