"""Times cula's ops on the public configs (bf16, D=128) and, when installed, FLA's Triton kernels
on the same inputs in the same process; prints a markdown table. Timing: CUDA events around each
call, 10 warm-up calls, median of 50.

    python benchmarks/bench.py [--variants sm90a generic] [--out results.md]
"""

from __future__ import annotations

import argparse
import os
import statistics

import cula
import torch

H200_COPY_TBPS = 4.2  # measured device-to-device copy bandwidth (bytes read + written)


def timed(fn, reps=50, warmup=10) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def prefill_case(batch, total, heads, state, lengths=None):
    dim = 128
    q, k, v = (torch.randn(batch, total, heads, dim, device="cuda", dtype=torch.bfloat16) * 0.1 for _ in range(3))
    g = -torch.rand(heads, device="cuda") * 0.1
    cu = None if lengths is None else torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    nseq = batch if lengths is None else len(lengths)
    h0 = torch.randn(nseq, heads, dim, dim, device="cuda") if state else None
    floor = 4 * batch * total * heads * dim * 2 + (2 * nseq * heads * dim * dim * 4 if state else 0)
    args = dict(g_gamma=g, initial_state=h0, output_final_state=state, cu_seqlens=cu)
    return (q, k, v), args, floor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", nargs="+", default=["sm90a", "generic"])
    parser.add_argument("--out")
    opts = parser.parse_args()
    try:
        from fla.ops.simple_gla import chunk_simple_gla as fla_chunk
        from fla.ops.simple_gla import fused_recurrent_simple_gla as fla_recurrent
    except ImportError:
        fla_chunk = fla_recurrent = None

    cases = [
        ("prefill B=2 T=8192 H=32", "chunk", prefill_case(2, 8192, 32, False)),
        ("prefill B=2 T=8192 H=64", "chunk", prefill_case(2, 8192, 64, False)),
        ("prefill B=8 T=1024 H=32 +state", "chunk", prefill_case(8, 1024, 32, True)),
        ("varlen 16 seqs T=16384 H=64 +state", "chunk", prefill_case(1, 16384, 64, True, [1024] * 16)),
    ]
    rows = []
    for name, _, ((q, k, v), args, floor) in cases:
        row = [name]
        for variant in opts.variants:
            os.environ["CULA_FORCE_GENERIC"] = "1" if variant == "generic" else "0"
            ms = timed(lambda: cula.chunk_simple_gla(q, k, v, **args))
            row += [f"{ms:.3f}", f"{floor / ms / 1e9:.2f}"]
        if fla_chunk is not None:
            row.append(f"{timed(lambda: fla_chunk(q, k, v, **args)):.3f}")
        rows.append(row)
    for batch in (1, 16, 256):
        heads, dim = 32, 128
        q, k, v = (torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        pool = torch.zeros(batch, heads, dim, dim, device="cuda")
        g = -torch.rand(heads, device="cuda") * 0.1
        floor = 2 * batch * heads * dim * dim * 4
        row = [f"decode B={batch} H=32 (in place)"]
        for variant in opts.variants:
            os.environ["CULA_FORCE_GENERIC"] = "1" if variant == "generic" else "0"
            ms = timed(lambda: cula.simple_gla_decode(q, k, v, pool, g_gamma=g))
            row += [f"{ms:.3f}", f"{floor / ms / 1e9:.2f}"]
        if fla_recurrent is not None:
            row.append(f"{timed(lambda: fla_recurrent(q[:, None], k[:, None], v[:, None], g_gamma=g, initial_state=pool, output_final_state=True)):.3f}")  # noqa: E501
        rows.append(row)
    head = ["config"] + [f"cula {v} {u}" for v in opts.variants for u in ("ms", "TB/s")]
    if fla_chunk is not None:
        head.append("FLA ms")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    text = f"{torch.cuda.get_device_name()} (copy bandwidth reference {H200_COPY_TBPS} TB/s)\n\n" + "\n".join(lines)
    print(text)
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
