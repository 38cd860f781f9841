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
        # The gated recurrence: GVA, varlen with an empty sequence, in-kernel gate, pool slots per token.
        gt, beta = torch.randn(1, 150, 4, device="cuda"), torch.rand(1, 150, 4, device="cuda", dtype=dtype)
        vv = torch.randn(1, 150, 4, dim, device="cuda", dtype=dtype)
        cu3 = torch.tensor([0, 70, 70, 150], device="cuda", dtype=torch.int64)
        h3 = torch.randn(3, 4, dim, dim, device="cuda")
        gate = dict(use_gate_in_kernel=True, A_log=torch.zeros(4, device="cuda"), dt_bias=torch.zeros(4, device="cuda"))
        cula.chunk_gated_delta_rule(q, k, vv, gt, beta, initial_state=h3, output_final_state=True, cu_seqlens=cu3,
                                    use_qk_l2norm_in_kernel=True, **gate)
        os.environ["CULA_GDN_CHUNK_LAUNCHES"] = "2"  # the same in two launches (prep, state kernel)
        for prep in ("solve", "inverse"):  # (the prep kernel's two ways to W and U0)
            os.environ["CULA_GDN_PREP"] = prep
            cula.chunk_gated_delta_rule(q, k, vv, gt, beta, initial_state=h3, output_final_state=True,
                                        cu_seqlens=cu3, use_qk_l2norm_in_kernel=True, **gate)
        del os.environ["CULA_GDN_CHUNK_LAUNCHES"], os.environ["CULA_GDN_PREP"]
        os.environ["CULA_GDN_SPLIT"] = "2"  # one sequence in two segments (identity run, steps, fix)
        cula.chunk_gated_delta_rule(q[:, :130], k[:, :130], vv[:, :130], gt[:, :130], beta[:, :130],
                                    initial_state=h3[:1], output_final_state=True, use_qk_l2norm_in_kernel=True)
        del os.environ["CULA_GDN_SPLIT"]
        # CTAs that walk several items (more items than SMs: the _walk kernels), an empty sequence first.
        lens = [0] + [1 + 37 * i % 130 for i in range(1, 64)]
        cuw = torch.tensor([0] + lens, device="cuda").cumsum(0)
        tw = sum(lens)
        qw, kw = (torch.randn(1, tw, 2, dim, device="cuda", dtype=dtype) for _ in range(2))
        vw = torch.randn(1, tw, 4, dim, device="cuda", dtype=dtype)
        bw = torch.rand(1, tw, 4, device="cuda", dtype=dtype)
        cula.chunk_gated_delta_rule(qw, kw, vw, torch.randn(1, tw, 4, device="cuda"), bw,
                                    initial_state=torch.randn(64, 4, dim, dim, device="cuda"), output_final_state=True,
                                    cu_seqlens=cuw, use_qk_l2norm_in_kernel=True, **gate)
        pool = torch.randn(8, 4, dim, dim, device="cuda")
        cula.gated_delta_rule_decode(q[0, :6].view(3, 2, 2, dim), k[0, :6].view(3, 2, 2, dim),
                                     vv[0, :6].view(3, 2, 4, dim), gt[0, :6].view(3, 2, 4), beta[0, :6].view(3, 2, 4),
                                     pool, state_indices=torch.tensor([[0, 1, 2], [-1, -1, -1], [5, 6, 7]],
                                                                      device="cuda"),
                                     num_accepted_tokens=torch.tensor([2, 1, 3], device="cuda"))
        cula.fused_recurrent_simple_gla(q, k, v, g=gt[..., :2].contiguous(), initial_state=h0[:1].expand(2, -1, -1, -1)
                                        .contiguous(), output_final_state=True, cu_seqlens=cu)
        cula.chunk_simple_gla(q, k, v, g=gt[..., :2].contiguous(), initial_state=h0, output_final_state=True,
                              cu_seqlens=cu)
        # KDA: the per-key gate (its decay table in shared memory), the lower-bound gate, a decode step.
        gk = torch.randn(1, 150, 4, dim, device="cuda")
        kgate = dict(use_gate_in_kernel=True, dt_bias=torch.zeros(4 * dim, device="cuda"), lower_bound=-5.0)
        cula.chunk_kda(q, k, vv, gk, beta, initial_state=h3, output_final_state=True, cu_seqlens=cu3, **kgate)
        # The raw log gate, steep from token 64 on: diagonal blocks too wide for mma (the fallback from
        # q, k and G), beside chunks with none.
        steep = -0.1 * torch.rand(1, 150, 4, dim, device="cuda")
        steep[:, 64:] *= 200
        cula.chunk_kda(q, k, vv, steep, beta, initial_state=h3, output_final_state=True, cu_seqlens=cu3)
        cula.kda_decode(q[0, :3], k[0, :3], vv[0, :3], gk[0, :3], beta[0, :3], pool,
                        state_indices=torch.tensor([4, -1, 3], device="cuda"), **kgate)
torch.cuda.synchronize()
print("sanitize_ops: all kernels ran")
