// The chunked form of the gated delta rule's recurrence (common/recurrence.cuh), for prefill. A
// family's kernel file declares its entry points with CULA_GATED_CHUNK_KERNEL (gated_chunk<T, D>).
// (simple_gla with a per-token gate, which has no delta rule, runs simple_gla's own chunked kernels.)
//
// A CTA walks one (sequence n, value head hv, value slice vb of BV = 64 columns) chunk by chunk, C =
// 64 tokens each, with two warpgroups (CULA_GATED_CHUNK_THREADS):
//   chain:  the loads, the gates, the delta rule's solve and the state, which carries from chunk to
//           chunk: the D x BV state slice S in fp32 registers (mma accumulator layout: warp w
//           holds rows 64 mt + 16 w + {g, g+8}) and a 16-bit copy in shared memory (s[c % 2] at
//           chunk c's start);
//   output: what does not depend on the state, off the chain's path: the next chunk's K K^T, 1 / |k|,
//           A and the inverses of its diagonal blocks (the system the chain solves), then o of a
//           chunk from its U and state copy, while the chain goes on with the next chunk.
// Each hands chunks over to the other by named barriers (bar.arrive / bar.sync). A single
// warpgroup doing both took 1.43 ms at B2 T8192 H16 HV32 (H200), the two 0.96; with the system
// formed by the output warpgroup (whose warps had waited for the chain 64% of their time), the
// chain's chunk loses a third of its work.
//
// In a chunk, with tokens i, j, G_i the cumulative log decay of tokens 0..i and k, q L2-normalised
// when asked (the norms are summed from the mma fragments and applied to the products, so the
// boxes stay as loaded):
//   A_ij = beta_i (k_i . k_j) exp(G_i - G_j)         for j < i (strictly lower)
//   X_i  = beta_i (v_i - exp(G_i) S^T k_i)
//   (I + A) U = X                                     U: the values the delta rule writes
//   o_i  = scale (exp(G_i) S^T q_i + sum_{j <= i} (q_i . k_j) exp(G_i - G_j) u_j)
//   S   <- exp(G_L) S + sum_j exp(G_L - G_j) k_j u_j^T
// which is the token loop exactly (u_j = beta_j (v_j - S_{j-1}'^T k_j) of the recurrence). Rows past a sequence's end get g = 0 and beta = 0, and
// zeros for q, k, v: they add nothing, and G_L is G at the last real token.
//
// (I + A) U = X is solved by blocks of 32 rows (common/chunk_solve.cuh), each warp for its own 16
// columns: the chain's solve is its longest latency-bound phase, and 32-row blocks take it from 20
// dependent mma to 12. The output warpgroup forms chunk c+1's A and the 32-row diagonal inverses
// (from the 16-row ones) once chunk c's U is solved, into the buffers that solve read; the chain's
// solve of chunk c+1 waits for them.
//
// The boxes of the next chunk (q, k, v) are loaded by cp.async while the current one is computed
// (three buffers: the output warpgroup may still read chunk c-1's); everything else is warp-level
// mma.sync (m16n8k16) on swizzled tiles, which every target runs.
#pragma once

#include "common/chunk_gates.cuh"
#include "common/chunk_solve.cuh"
#include "common/frags.cuh"
#include "common/ptx.cuh"
#include "common/recurrence.cuh"
#include "common/seqs.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "params.h"

template <int D>
struct GatedChunkSmem {  // the 16-bit tiles first, each a multiple of 1 KiB: all stay 1024-byte aligned
  u16 q[3][CULA_CHUNK * D];           // chunk c's boxes in [c % 3], 128-byte swizzle (SwizzledTile)
  u16 k[3][CULA_CHUNK * D];
  u16 v[3][CULA_CHUNK * CULA_BLOCK_V];
  u16 s[2][D * CULA_BLOCK_V];         // 16-bit copies of the state at chunk c's start in s[c % 2]
  u16 u[2][CULA_CHUNK * CULA_BLOCK_V];  // chunk c's U in u[c % 2], 16-bit (operand of o and of the update)
  float a[CULA_CHUNK][CULA_CHUNK + 4];  // A (rows padded: the solve's fragment loads hit 32 banks)
  float dinv[CULA_CHUNK][CULA_DINV32_PITCH];  // inverses of the 32-row diagonal blocks of I + A
  float x[CULA_CHUNK][CULA_BLOCK_V + 8];  // X, then U as the solve goes (rows padded: fragment loads hit 32 banks)
  float g2[3][CULA_CHUNK];    // chunk c's G in log2 units in g2[c % 3] (the chain scans chunk c+1's gates
  float rk[3][CULA_CHUNK];    // while the output warpgroup may still read chunk c-1's), 1 / |k_j| (1 without
  float beta[3][CULA_CHUNK];  // l2norm) in rk[c % 3], beta in beta[c % 3]
  static __device__ GatedChunkSmem& get(unsigned char* raw) { return smem_aligned_1024<GatedChunkSmem>(raw); }
};

// Rows [0, rows) of a chunk's q, k (head h) and value slice into buffer `buf` by cp.async, one
// group per thread of the chain warpgroup; rows past `rows` are zero-filled.
template <int D>
__device__ __forceinline__ void gated_chunk_load(GatedChunkSmem<D>& sm, int buf, const u16* q, const u16* k,
                                                 const u16* v, long long qk_stride, long long v_stride, int rows) {
  constexpr int C = CULA_CHUNK, N = CULA_GATED_CHAIN_THREADS;
  const int tid = threadIdx.x;
  cp_async_rows<D, N, 2>({SwizzledTile{sm.q[buf], C}, SwizzledTile{sm.k[buf], C}}, {q, k}, qk_stride, rows, tid);
  cp_async_rows<CULA_BLOCK_V, N>(SwizzledTile{sm.v[buf], C}, v, v_stride, rows, tid);
  cp_async_commit();
}

// Sums of squares of the rows g (ss[0]) and g + 8 (ss[1]) of a 16 x 16 A fragment, added to ss;
// over a row's k-steps and the 4 lanes of the quad (quad_sum), the row's squared norm.
template <typename T>
__device__ __forceinline__ void add_row_squares(float (&ss)[2], const u32 (&a)[4]) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const float lo = to_float<T>((u16)(a[r] & 0xffffu)), hi = to_float<T>((u16)(a[r] >> 16));
    ss[r & 1] += lo * lo + hi * hi;
  }
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Rows 16 w .. 16 w + 15 (w: the warp within its warpgroup) of the tile tx (q or k of the chunk)
// times K^T, for the key tiles up to the diagonal (XK, with KEYS; those above it stay zero, but by
// wgmma: all of them), and times the state copy ts (XS, with STATE); with `norms`, the rows' sums
// of squares over the lanes of the quad (ss). WG (sm_90a, a whole warpgroup): the warp's rows of tx
// by ldmatrix are the A operand of the products from registers, K and the state copy read by wgmma.
template <typename T, int D, bool WG, bool KEYS = true, bool STATE = true>
__device__ __forceinline__ void rows_times_keys_and_state(float (&XK)[8][4], float (&XS)[8][4], float (&ss)[2],
                                                          const SwizzledTile& tx, const SwizzledTile& tk,
                                                          const SwizzledTile& ts, bool norms) {
  static_assert(KEYS || STATE, "a product");
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
  if constexpr (WG) {
    constexpr int C = CULA_CHUNK;
    u32 a[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      ldsm_x4(a[kk], tx.at(w * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
      if (norms) add_row_squares<T>(ss, a[kk]);
    }
    const u64 dk = smem_desc(tk.base), ds = smem_desc(ts.base);
    wgmma_fence();
    if constexpr (KEYS)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) WgmmaRS<T, 0>::run(&XK[0][0], a[kk], desc_at(dk, kmajor_step(kk, C)));
    if constexpr (STATE)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) WgmmaRS<T, 1>::run(&XS[0][0], a[kk], desc_at(ds, mnmajor_step(kk)));
    wgmma_commit();
    wgmma_wait<0>();
  } else {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      u32 a[4];
      ldsm_x4(a, tx.at(w * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
      if (norms) add_row_squares<T>(ss, a);
      if constexpr (KEYS)
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          if (np > w) continue;  // above the diagonal block
          u32 b[4];
          ldsm_x4(b, tk.at(np * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + ((lane >> 3) & 1) * 8));
          mma<T>(XK[2 * np], a, b[0], b[1]);
          mma<T>(XK[2 * np + 1], a, b[2], b[3]);
        }
      if constexpr (STATE) mma_tile_rows<T>(XS, a, ts, kk, lane);
    }
  }
  if (norms)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) ss[hf] = quad_sum(ss[hf]);
}

// The output warpgroup's part of the delta rule for chunk c (warp w of it: rows 16 w + {g, g+8}),
// which needs no state: K K^T and 1 / |k| of its rows (into rk), then (after a barrier of the
// warpgroup for all rows' norms) A of its rows and the inverse of its 16-row diagonal block, and
// (after another) the 32-row inverses, two warps each; then the chain may solve chunk c.
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_chunk_system(GatedChunkSmem<D>& sm, int c, bool l2norm) {
  const int b = c % 3, lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const SwizzledTile tk{sm.k[b], CULA_CHUNK};
  const float* g2 = sm.g2[b];
  float* rk = sm.rk[b];
  float KK[8][4] = {}, unused[8][4], ss[2] = {};
  rows_times_keys_and_state<T, D, WG, true, false>(KK, unused, ss, tk, tk, tk, l2norm);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
    if (t == 0) rk[16 * w + g + 8 * hf] = l2norm ? rsqrtf(ss[hf] + 1e-6f) : 1.f;
  output_sync();  // every row's norm
  float gi[2], fi[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * w + g + 8 * hf;
    gi[hf] = g2[i];
    fi[hf] = sm.beta[b][i] * rk[i];
  }
  // The blocks up to the diagonal; no mask: the solve reads neither the diagonal blocks' entries on
  // and above the diagonal nor the blocks above it.
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    if (nt > 2 * w + 1) continue;
    const int j = nt * 8 + 2 * t;  // key token
    const float2 rj = *(const float2*)&rk[j], gj = *(const float2*)&g2[j];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      *(float2*)&sm.a[16 * w + g + 8 * hf][j] =
          make_float2(KK[nt][2 * hf] * fi[hf] * rj.x * fast_exp2(gi[hf] - gj.x),
                      KK[nt][2 * hf + 1] * fi[hf] * rj.y * fast_exp2(gi[hf] - gj.y));
  }
  __syncwarp();
  invert_diagonal_block<CULA_CHUNK + 4, CULA_DINV32_PITCH>(sm.a, sm.dinv, w, 16 * (w & 1));
  output_sync();  // the 16-row inverses
  join_diagonal_inverses<CULA_CHUNK + 4>(sm.a, sm.dinv, w >> 1, w & 1);
  output_sync();  // (without it, racecheck reports the joins' stores as racing with the solve's loads)
  handover_arrive(CULA_CHUNK_SOLVE_BAR);  // A and the diagonal inverses of chunk c, and its rk
}

// The chain's part of the delta rule for chunk c (warp w: rows 16 w + {g, g+8}): K S from the state
// copy ts, then (once the output warpgroup has formed the chunk's system) X of its rows, and after a
// barrier for all rows, the solve; U in 16 bits into u[c % 2].
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_chunk_solve(GatedChunkSmem<D>& sm, int c, const SwizzledTile& ts) {
  const int b = c % 3, lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const SwizzledTile tk{sm.k[b], CULA_CHUNK}, tv{sm.v[b], CULA_CHUNK};
  float unused[8][4], KS[8][4] = {}, ss[2] = {};
  rows_times_keys_and_state<T, D, WG, false, true>(unused, KS, ss, tk, tk, ts, false);
  handover_sync(CULA_CHUNK_SOLVE_BAR);  // the chunk's A, diagonal inverses and rk
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * w + g + 8 * hf;
    const float bi = sm.beta[b][i], fx = sm.rk[b][i] * fast_exp2(sm.g2[b][i]);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int j = nt * 8 + 2 * t;  // value column
      const u32 vv = lds_u32(tv.at(i, j));
      const float v0 = to_float<T>((u16)(vv & 0xffffu)), v1 = to_float<T>((u16)(vv >> 16));
      *(float2*)&sm.x[i][j] = make_float2(bi * (v0 - fx * KS[nt][2 * hf]), bi * (v1 - fx * KS[nt][2 * hf + 1]));
    }
  }
  chain_sync();  // X
  const SwizzledTile tu{sm.u[c & 1], CULA_CHUNK};
  const auto emit = [&](int row, int col, float u0, float u1) {
    sts_u32(tu.at(row, col), pack2<T>(u0, u1));  // U in 16 bits: the operand of o and of the update
  };
  solve_lower_blocks32<2, CULA_CHUNK + 4, CULA_BLOCK_V + 8>(sm.a, sm.dinv, sm.x, emit);
}

// The output warpgroup (warp w of it: o rows 16 w + {g, g+8}): chunk 0's system once its boxes and
// gates are in; then for each chunk c, once the chain warpgroup hands its U over, the system of
// chunk c+1 (whose boxes and gates came with it), and Q K^T (masked, decayed) and Q S (the state
// copy) of chunk c, the squared norms of its q rows, o = that + P U, stored; then the chunk's
// buffers go back.
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_chunk_output(GatedChunkSmem<D>& sm, const CulaGdnParams& p, u16* o,
                                                   long long v_stride, long long len) {
  constexpr int C = CULA_CHUNK;
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int nchunks = (int)((len + C - 1) / C);
  if (nchunks == 0) return;
  handover_sync(CULA_CHUNK_READY_BAR + 1);  // chunk 0's boxes and gates (the hand-over of a chunk -1)
  gated_chunk_system<T, D, WG>(sm, 0, p.l2norm != 0);
  for (int c = 0; c < nchunks; ++c) {
    const long long tok0 = (long long)c * C;
    const int rows = chunk_rows(len, c), b = c % 3, slot = c & 1;
    const SwizzledTile tq{sm.q[b], C}, tk{sm.k[b], C}, ts{sm.s[slot], D};
    const SwizzledTile tu{sm.u[slot], C};
    const float* g2 = sm.g2[b];
    const float* rk = sm.rk[b];
    handover_sync(CULA_CHUNK_READY_BAR + slot);
    if (c + 1 < nchunks) gated_chunk_system<T, D, WG>(sm, c + 1, p.l2norm != 0);
    float QK[8][4] = {}, O[8][4] = {}, ss[2] = {};
    rows_times_keys_and_state<T, D, WG>(QK, O, ss, tq, tk, ts, p.l2norm != 0);
    float fq[2], gi[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      fq[hf] = p.scale * (p.l2norm ? rsqrtf(ss[hf] + 1e-6f) : 1.f);
      gi[hf] = g2[16 * w + g + 8 * hf];
      const float fo = fq[hf] * fast_exp2(gi[hf]);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        O[nt][2 * hf] *= fo;
        O[nt][2 * hf + 1] *= fo;
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (nt > 2 * w + 1) continue;  // above the diagonal block
      const int j = nt * 8 + 2 * t;
      const float2 rj = *(const float2*)&rk[j], gj = *(const float2*)&g2[j];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * w + g + 8 * hf;
        const float p0 = QK[nt][2 * hf] * fq[hf] * rj.x * fast_exp2(gi[hf] - gj.x);
        const float p1 = QK[nt][2 * hf + 1] * fq[hf] * rj.y * fast_exp2(gi[hf] - gj.y);
        QK[nt][2 * hf] = j <= i ? p0 : 0.f;  // (the causal mask: within the diagonal block)
        QK[nt][2 * hf + 1] = j + 1 <= i ? p1 : 0.f;
      }
    }
    if constexpr (WG) {  // (the fragments past the warp's diagonal block are zero: wgmma computed QK there)
      u32 af[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        score_fragment<T>(af[kk], QK, kk);
#pragma unroll
        for (int e = 0; e < 4; ++e) af[kk][e] = kk <= w ? af[kk][e] : 0u;
      }
      const u64 du = smem_desc(tu.base);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) WgmmaRS<T, 1>::run(&O[0][0], af[kk], desc_at(du, mnmajor_step(kk)));
      wgmma_commit();
      wgmma_wait<0>();
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kk > w) continue;  // QK is zero there
        u32 a[4];
        score_fragment<T>(a, QK, kk);
        mma_tile_rows<T>(O, a, tu, kk, lane);
      }
    }
    handover_arrive(CULA_CHUNK_DONE_BAR + slot);  // (the accumulators hold all it still needs)
    store_o<T, 8>(o, O, tok0, 16 * w, g, t, rows, v_stride, 1.f);
  }
}

// The chain warpgroup: the loads, the gates, the delta rule's solve and the state, chunk after
// chunk (S in registers: warp w holds rows 64 mt + 16 w + {g, g+8}). Chunk c's U goes to the output
// warpgroup as soon as it is solved, with chunk c+1's boxes and gates (loaded and scanned a chunk
// ahead); the state update follows, and its 16-bit copy for chunk c+1 waits until the output
// warpgroup is done with chunk c-1 (whose copy buffer it reuses).
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_chunk_chain(GatedChunkSmem<D>& sm, const CulaGdnParams& p, const u16* q,
                                                  const u16* k, const u16* v, long long qk_stride, long long v_stride,
                                                  long long len, long long gb0, long long state) {
  constexpr int C = CULA_CHUNK, MT = D / 64;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, t = lane & 3;
  const int hv = blockIdx.y;
  const auto row0 = [w](int mt) { return mt * 64 + w * 16; };
  const InGate ig = in_gate(p, hv);

  float S[MT][32];
  for_state_pairs(S, row0, [&](int row, int col, float& x, float& y) {
    const float2 s = p.h0 ? *(const float2*)&p.h0[state + (long long)row * D + col] : make_float2(0.f, 0.f);
    x = s.x;
    y = s.y;
  });
  const int nchunks = (int)((len + C - 1) / C);
  ChunkGates gates;
  if (nchunks > 0) {
    gated_chunk_load<D>(sm, 0, q, k, v, qk_stride, v_stride, chunk_rows(len, 0));
    if (w == 0) {
      chunk_load_gates(gates, p, gb0, 0, len);
      chunk_gate_scan(sm.beta[0], sm.g2[0], gates, p, ig, chunk_rows(len, 0));
      if (nchunks > 1) chunk_load_gates(gates, p, gb0, C, len);
    }
    copy_stmatrix<T>(S, row0, SwizzledTile{sm.s[0], D});
  }
  for (int c = 0; c < nchunks; ++c) {
    const long long tok0 = (long long)c * C;
    const int b = c % 3, slot = c & 1;
    if (c == 0) cp_async_wait<0>();  // (chunk c's boxes from then on: before chunk c-1's hand-over)
    if constexpr (WG) fence_async_smem();  // (the boxes and the state copy: wgmma operands)
    chain_sync();  // chunk c's boxes and state copy are in; the chain is done with chunk c-1
    if (c == 0) handover_arrive(CULA_CHUNK_READY_BAR + 1);  // chunk 0's boxes and gates, for its system
    if (c + 1 < nchunks) {  // into chunk c-2's buffers, which the output warpgroup gave back (below)
      const long long next = tok0 + C;
      gated_chunk_load<D>(sm, (c + 1) % 3, q + next * qk_stride, k + next * qk_stride, v + next * v_stride,
                          qk_stride, v_stride, chunk_rows(len, c + 1));
      if (w == 0) {  // (chunk c-2's gates, which the output warpgroup is done with too)
        chunk_gate_scan(sm.beta[(c + 1) % 3], sm.g2[(c + 1) % 3], gates, p, ig, chunk_rows(len, c + 1));
        if (c + 2 < nchunks) chunk_load_gates(gates, p, gb0, next + C, len);
      }
    }
    gated_chunk_solve<T, D, WG>(sm, c, SwizzledTile{sm.s[slot], D});
    if (c + 1 < nchunks) cp_async_wait<0>();  // chunk c+1's boxes, for the output warpgroup's system
    if constexpr (WG) fence_async_smem();     // (U and those boxes: wgmma operands)
    chain_sync();  // U
    handover_arrive(CULA_CHUNK_READY_BAR + slot);
    const SwizzledTile tk{sm.k[b], C}, tu{sm.u[slot], C};
    const float* g2 = sm.g2[b];
    const float* rk = sm.rk[b];

    // S <- exp(G_L) S + sum_j exp(G_L - G_j) k_j u_j^T (G_L: the last row's, rows past the end add 0)
    const float gl = g2[C - 1], dl = fast_exp2(gl);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 32; ++e) S[mt][e] *= dl;
    // The A operand (K^T, its token columns scaled) from registers: by mma.sync a k-step at a
    // time, by wgmma (WG) all k-steps' fragments first, then one batch.
    u32 a[C / 16][MT][4];
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      float f[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = kk * 16 + 2 * t + (e & 1) + (e >> 1) * 8;
        f[e] = rk[j] * fast_exp2(gl - g2[j]);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        u32(&x)[4] = a[kk][mt];
        ldsm_x4_trans(x, tk.at(kk * 16 + (lane & 7) + ((lane >> 4) & 1) * 8, row0(mt) + ((lane >> 3) & 1) * 8));
        x[0] = scale2<T>(x[0], f[0], f[1]);
        x[1] = scale2<T>(x[1], f[0], f[1]);
        x[2] = scale2<T>(x[2], f[2], f[3]);
        x[3] = scale2<T>(x[3], f[2], f[3]);
      }
      if constexpr (!WG) mma_state_rows<T>(S, a[kk], tu, kk, lane);
    }
    if constexpr (WG) {
      const u64 du = smem_desc(tu.base);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < C / 16; ++kk)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) WgmmaRS<T, 1>::run(S[mt], a[kk][mt], desc_at(du, mnmajor_step(kk)));
      wgmma_commit();
      wgmma_wait<0>();
    }
    if (c >= 1) handover_sync(CULA_CHUNK_DONE_BAR + (slot ^ 1));  // the output of chunk c-1 is done
    if (c + 1 < nchunks) copy_stmatrix<T>(S, row0, SwizzledTile{sm.s[slot ^ 1], D});
  }
  if (nchunks > 0) handover_sync(CULA_CHUNK_DONE_BAR + ((nchunks - 1) & 1));  // every arrival is met
  if (p.ht_mode == CULA_HT_FINAL)
    for_state_pairs(S, row0, [&](int row, int col, float& x, float& y) {
      *(float2*)&p.ht[state + (long long)row * D + col] = make_float2(x, y);
    });
}

template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_chunk(const CulaGdnParams& p) {
  static_assert(sizeof(GatedChunkSmem<D>) + 1024 <= CULA_GATED_CHUNK_SMEM_BYTES(D), "shared memory size");
  static_assert(CULA_GATED_CHUNK_THREADS == 2 * CULA_GATED_CHAIN_THREADS && CULA_GATED_CHAIN_THREADS == 128 &&
                    CULA_BLOCK_V == 64 && CULA_CHUNK == 64,
                "two warpgroups; 4 warps of 16 rows / 16 columns each");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  GatedChunkSmem<D>& sm = GatedChunkSmem<D>::get(smem_raw);
  const int vb = blockIdx.x, hv = blockIdx.y, n = blockIdx.z, HV = p.v_heads, H = p.heads;
  const int h = hv / (HV / H);
  long long bos, len;
  clamped_seq_bounds(p.seqs, n, p.total_tokens, bos, len);
  const long long qk_stride = (long long)H * D, v_stride = (long long)HV * D;
  const long long vcol = (long long)hv * D + vb * CULA_BLOCK_V;
  const bool chain = in_first_threads<WG, CULA_GATED_CHAIN_THREADS>();
  if (chain) {
    const u16* q = (const u16*)p.q + bos * qk_stride + (long long)h * D;
    const u16* k = (const u16*)p.k + bos * qk_stride + (long long)h * D;
    const u16* v = (const u16*)p.v + bos * v_stride + vcol;
    gated_chunk_chain<T, D, WG>(sm, p, q, k, v, qk_stride, v_stride, len, bos * HV + hv,
                                ((long long)n * HV + hv) * D * D + vb * CULA_BLOCK_V);
  } else {
    gated_chunk_output<T, D, WG>(sm, p, (u16*)p.o + bos * v_stride + vcol, v_stride, len);
  }
}

// The entry points of the chunked gated kernel (extern "C", looked up by name from the host): NAME
// by mma.sync (every target), NAME_sm90a by wgmma (its body in the sm_90a cubin only).
#define CULA_GATED_CHUNK_KERNEL(NAME, T, D)                                                            \
  extern "C" __global__ void __launch_bounds__(CULA_GATED_CHUNK_THREADS)                              \
      NAME(const __grid_constant__ CulaGdnParams p) {                                                 \
    gated_chunk<T, D, false>(p);                                                                      \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(CULA_GATED_CHUNK_THREADS)                              \
      NAME##_sm90a(const __grid_constant__ CulaGdnParams p) {                                         \
    CULA_SM90A_ONLY((gated_chunk<T, D, true>(p)));                                                    \
  }
