"""Runs every kernel once on small shapes, both variants (split sequences and a one-CTA persistent
grid too); meant to run under `compute-sanitizer --tool memcheck|racecheck` (exit status 0 and no
reports = clean)."""

import os

import cula
import torch

torch.manual_seed(0)
for variant in ("sm90a", "generic"):
    os.environ["CULA_FORCE_GENERIC"] = "1" if variant == "generic" else "0"
    for dim, dtype in ((64, torch.bfloat16), (128, torch.float16)):
        q, k, v = (torch.randn(1, 150, 2, dim, device="cuda", dtype=dtype) for _ in range(3))
        h0 = torch.randn(2, 2, dim, dim, device="cuda")
        cu = torch.tensor([0, 70, 150], device="cuda", dtype=torch.int32)
        g = -torch.rand(2, device="cuda")
        cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        os.environ["CULA_CHUNK_CTAS"] = "1"  # one CTA taking every item in turn (partial last chunks too)
        cula.chunk_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        del os.environ["CULA_CHUNK_CTAS"]
        cula.fused_recurrent_simple_gla(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        # Fixed length: the sequences split into 3 pieces (states pass + pieces), then unsplit.
        for parts in ("3", "1"):
            os.environ["CULA_SPLIT_PARTS"] = parts
            cula.chunk_simple_gla(q.view(2, 75, 2, dim), k.view(2, 75, 2, dim), v.view(2, 75, 2, dim), g_gamma=g,
                                  initial_state=h0, output_final_state=True)
        del os.environ["CULA_SPLIT_PARTS"]
        cula.simple_gla_decode(q[0, :2], k[0, :2], v[0, :2], h0, g_gamma=g,
                               state_indices=torch.tensor([1, -1], device="cuda"))
torch.cuda.synchronize()
print("sanitize_ops: all kernels ran")
