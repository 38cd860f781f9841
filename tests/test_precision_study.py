"""tools/precision_study.py (the accuracy cost of each 16-bit rounding of the chunked gated delta
rule, in numpy): its roundings are torch's, its chunked form without roundings is the recurrence,
and its model of today's kernels stays inside the GPU tests' bound."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import precision_study as ps  # noqa: E402


def test_roundings_are_torchs():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000) * 10.0 ** rng.integers(-6, 6, 10000),
                        [0.0, -0.0, 1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 65504.0]])
    x32 = torch.tensor(x, dtype=torch.float32)
    assert np.array_equal(ps.bf16(x), x32.to(torch.bfloat16).double().numpy())
    # tf32: 10 of float32's mantissa bits, to nearest even (frexp's mantissa in [0.5, 1) to 11 bits)
    m, e = np.frexp(x32.double().numpy())
    assert np.array_equal(ps.tf32(x), np.ldexp(np.round(m * 2.0 ** 11) / 2.0 ** 11, e))
    assert ps.tf32(1 + 2 ** -11) == 1.0 and ps.tf32(1 + 3 * 2 ** -11) == 1 + 2 ** -9
    assert ps.bf16(1 + 2 ** -8) == 1.0 and ps.bf16(1 + 3 * 2 ** -8) == 1 + 2 ** -6


def test_hi_lo_keeps_16_bits():
    rng = np.random.default_rng(0)
    x = ps.f32(rng.standard_normal(10000) * 10.0 ** rng.integers(-6, 6, 10000))
    assert np.max(np.abs(ps.bf16x2(x) - x) / np.abs(x)) <= 2.0 ** -16  # bf16 alone keeps 8 bits
    assert np.max(np.abs(ps.bf16(x) - x) / np.abs(x)) > 2.0 ** -10
    assert np.array_equal(ps.bf16x2(ps.bf16(x)), ps.bf16(x))  # (lo is 0 where x is a bf16 number)


@pytest.mark.parametrize("l2norm", [False, True])
def test_chunked_form_is_the_recurrence(l2norm):
    r = ps.study(tokens=130, dim=64, heads=1, l2norm=l2norm, gmax=0.3, seed=1)  # 3 chunks, the last partial
    assert max(r["no rounding (float32 U)"]) < 1e-6
    today = r["the kernels today (all of: tf32 solve, tiles, state, o; U0 float32)"]
    assert 1e-3 < max(today) < 5e-3
    assert r["o stored in bf16 only"][1] < 1e-6  # o's rounding never reaches the state
    # the inverse applied as hi + lo costs nothing next to today's tf32 solve; one bf16 product does
    split = r["today, the same as bf16 hi + lo (two products)"]
    assert max(abs(a / b - 1) for a, b in zip(split, today, strict=True)) < 0.1
    assert r["today, the tf32 inverse's scaled columns in bf16 applied to k and v"][0] > 1.05 * today[0]
    # one launch with T ahead: U = T X costs what the block solve does with 10-bit operands, more with bf16's 7
    # and so does the one-launch solve by blocks of 16 rows (the kernel now), of 32, and of 32 from 8-row inverses
    for name in [f"today, one launch with T ahead: U = T X, both {ten_bits}" for ten_bits in ("tf32", "fp16")] + [
            "today, one launch by 16-row blocks (tf32: the kernel now, and in session 18)",
            "today, one launch by 32-row blocks (inverses from the 16-row ones, tf32: sessions 19-56)",
            "today, one launch by 32-row blocks, the 16-row inverses from 8-row ones too (tf32)"]:
        assert max(abs(a / b - 1) for a, b in zip(r[name], today, strict=True)) < 0.1, name
    assert r["today, one launch with T ahead: U = T X, both bf16"][0] > 1.05 * today[0]
    # the prep's right-hand sides could be stored in 10-bit fp16 at no cost; in bf16 they cost accuracy
    fp16_rhs = r["today, the right-hand sides stored in fp16"]
    assert max(abs(a / b - 1) for a, b in zip(fp16_rhs, today, strict=True)) < 0.1
    assert r["today, the right-hand sides (beta K exp(G), beta V) stored in bf16 (half the prep's X)"][0] > \
        1.05 * today[0]


@pytest.mark.parametrize("base", [16, 8])
@pytest.mark.parametrize("rows", [32, 20])  # (20: a chunk's last, partial block)
def test_32_row_block_inverse(base, rows):
    rng = np.random.default_rng(2)
    a = np.tril(rng.random((rows, rows)) * 0.5, -1)
    inv = np.linalg.inv(np.eye(rows) + a)
    err = {r: np.max(np.abs(ps.block_inverse(a, r, 32, base) - inv)) / np.max(np.abs(inv))
           for r in (ps.exact, ps.tf32)}
    assert err[ps.exact] < 1e-7  # (the products between the blocks are float32, as the kernel's accumulators)
    assert 1e-5 < err[ps.tf32] < 2e-3  # the off-diagonal blocks' products with tf32 operands


def test_kda_chunked_form_and_key_tiles():
    r = ps.kda_study(tokens=130, dim=64, heads=1, gmax=0.3, seed=1)  # 3 chunks, the last partial
    assert max(r["no rounding"]) < 1e-6  # the per-key chunked form (products by reference rows) is the recurrence
    today = r["the prep today (a key tile per row block: 40 KB at D = 128)"]
    assert 1e-3 < max(today) < 5e-3
    # smaller key tiles (one more 16-bit rounding of the left operands) cost at most a few percent
    for name in ("one 64-row key tile, the diagonal's (16 KB)",
                 "a 48-row key tile against the next block's first row, and the diagonal's (28 KB)"):
        assert max(a / b for a, b in zip(r[name], today, strict=True)) < 1.05, name
        assert r[name] != today, name  # (a rounding the model does make)
    # and the solve's right-hand side beta k exp(G) from the 16-bit XS box (no float32 X) costs nothing more
    one = r["one 64-row key tile, the diagonal's (16 KB)"]
    xs = r["one 64-row key tile, X's key half from the 16-bit XS box"]
    assert max(a / b for a, b in zip(xs, one, strict=True)) < 1.02 and xs != one
