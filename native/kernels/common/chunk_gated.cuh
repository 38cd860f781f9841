// The chunked form of the gated delta rule's recurrence (common/recurrence.cuh), for prefill. A
// family's kernel file declares its entry points with CULA_GATED_CHUNK_KERNEL (gated_chunk<T, D>).
// (simple_gla with a per-token gate, which has no delta rule, runs simple_gla's own chunked kernels.)
//
// A CTA walks one (sequence n, value head hv, value slice vb of BV = 64 columns) chunk by chunk, C =
// 64 tokens each, with four warpgroups (CULA_GDN_CHUNK_THREADS; the walking kernel, below, too):
//   chain:  the state, which carries from chunk to chunk, transposed: S^T (BV x D)
//           in fp32 registers (mma accumulator layout: warp w holds value columns 16 w + {g, g+8},
//           for_state_t). A chunk is (K S)^T = S^T K^T with S^T as the A operand from registers,
//           X^T, the solve (I + A) U = X as U^T = X^T (I + A)^-T in registers (warp w: its 16
//           columns, every row: no shared-memory round trip), U in 16 bits to shared memory for o,
//           and S^T <- exp(G_L) S^T + U^T (K scaled) with U^T again from registers; then a 16-bit
//           copy of S^T for the output (s[c % 2] at chunk c's start);
//   system: what the solve needs and the state does not: chunk c+1's K K^T and 1 / |k| while the
//           chain solves chunk c, then A and the inverses of its diagonal blocks, formed while the
//           chain updates the state with chunk c and starts chunk c+1;
//   output: o of chunk c from its U and state copy (Q K^T, Q S, P U), while the chain goes on;
//   loader: the boxes of chunk c+2 by cp.async and its gates (G, beta), scanned by warp 0, once
//           the output warpgroup starts chunk c.
// They hand chunks over by named barriers (bar.arrive / bar.sync). History (B2 T8192 H16 HV32):
// one warpgroup doing everything took 1.43 ms (H200), chain and output 0.96 (H200) and, with the
// system on the output warpgroup, 0.56 (H100); the chain transposed and the system in a warpgroup
// of its own, whose warp 0 also scanned the gates (on the chain's warp 0, the other three waited for
// it at every wgmma), 0.48 (H100), 0.468 (H200). The loads and the gates then moved to the output
// warpgroup, which waited most (session 21, H200: 0.442): the system's warp 0 waited on the gates'
// global loads there, and the other three for it at their first wgmma, every chunk; the system
// writes chunk c+1's A only when the chain has solved chunk c (A's buffers come free then; A twice,
// for a system a chunk ahead, was slower). Session 48 (H200, sm90a): a loader warpgroup alone 0.437
// -> 0.437 ms, K K^T before the chain's hand-over alone 0.437 -> 0.440, both 0.437 -> 0.422 (B1
// T1024 0.927x, D=64 0.887x); the walking kernel, which keeps three warpgroups, took the second
// step alone (varlen 16x1024 1.011x, 64 random lengths 1.002x). Then A twice in the sm90a D=128
// one-item kernel, so that the system runs a chunk ahead of the solve (gated_two_a): 0.420 -> 0.412.
// Sessions 49-50: the walking kernel's loads on a loader warpgroup of its own too (gated_loader).
//
// In a chunk, with tokens i, j, G_i the cumulative log decay of tokens 0..i and k, q L2-normalised
// when asked (the norms are summed from the mma fragments and applied to the products, so the
// boxes stay as loaded):
//   A_ij = beta_i (k_i . k_j) exp(G_i - G_j)         for j < i (strictly lower)
//   X_i  = beta_i (v_i - exp(G_i) S^T k_i)
//   (I + A) U = X                                     U: the values the delta rule writes
//   o_i  = scale (exp(G_i) S^T q_i + sum_{j <= i} (q_i . k_j) exp(G_i - G_j) u_j)
//   S   <- exp(G_L) S + sum_j exp(G_L - G_j) k_j u_j^T
// which is the token loop exactly (u_j = beta_j (v_j - S_{j-1}'^T k_j) of the recurrence). Rows past
// a sequence's end get g = 0 and beta = 0, and zeros for q, k, v: they add nothing, and G_L is G at
// the last real token.
//
// (I + A) U = X is solved by blocks of 16 rows (common/chunk_solve.cuh): 14 dependent mma. The
// system warpgroup forms chunk c+1's A and the inverses of its 16-row diagonal blocks once chunk
// c's U is solved (TWO: chunk c-1's), into the buffers that solve reads; the chain's solve of chunk
// c+1 waits for them. Session 56 (H100, timing-only ablations of the sm90a kernel, B2 T8192 H16
// HV32): the chain without its solve 1.032, the system without the diagonal inverses and their
// 32-row joins 0.868, the output without P U 0.886; so the joins went from the system (the solve
// by 16-row blocks needs none). Session 57 (H100, against the 32-row solve): B2 T8192 0.933
// (generic 0.973), varlen 16x1024 0.945 (0.973), B1 T32768 0.945 (0.959). Moving the 16-row
// inversions to the chain as well was slower (1.03-1.08): the chain then bounds.
//
// The boxes (q, k, v) are loaded by cp.async two chunks ahead, into three buffers: chunk c+2's
// into chunk c-1's once the chain has solved chunk c; everything else is warp-level mma.sync
// (m16n8k16) on swizzled tiles, which every target runs, or in the sm_90a variant wgmma.
#pragma once

#include "common/chunk_gates.cuh"
#include "common/chunk_solve.cuh"
#include "common/frags.cuh"
#include "common/ptx.cuh"
#include "common/recurrence.cuh"
#include "common/seqs.cuh"
#include "common/tma.cuh"
#include "common/walk.cuh"
#include "common/wgmma.cuh"
#include "params.h"

template <int D>
struct GatedChunkSmem {  // the 16-bit tiles first, each a multiple of 1 KiB: all stay 1024-byte aligned
  u16 q[3][CULA_CHUNK * D];           // chunk c's boxes in [c % 3], 128-byte swizzle (SwizzledTile)
  u16 k[3][CULA_CHUNK * D];
  u16 v[3][CULA_CHUNK * CULA_BLOCK_V];
  u16 s[2][CULA_BLOCK_V * D];         // 16-bit copies of S^T (value columns x keys) at chunk c's start in s[c % 2]
  u16 u[2][CULA_CHUNK * CULA_BLOCK_V];  // chunk c's U in u[c % 2], 16-bit (the operand of o)
  // A (rows padded: the solve's fragment loads hit 32 banks) and the inverses of the 16-row diagonal
  // blocks of I + A (block i at columns 16 (i & 1) of dinv, as invert_diagonal_block puts them):
  // the one-item kernel's chunk c in [c % 2]; the walking kernel's in [0], its table of items in
  // a[1] (walk()).
  float a[2][CULA_CHUNK][CULA_CHUNK + 4];
  float dinv[2][CULA_CHUNK][CULA_DINV_PITCH];
  float g2[4][CULA_CHUNK];    // chunk c's G in log2 units in g2[c % 4] (the output warpgroup scans chunk
  float rk[4][CULA_CHUNK];    // c+2's gates while chunk c's and c+1's are in use), 1 / |k_j|
  float beta[4][CULA_CHUNK];  // (1 without l2norm) in rk[c % 4], beta in beta[c % 4]
  static __device__ GatedChunkSmem& get(unsigned char* raw) { return smem_aligned_1024<GatedChunkSmem>(raw); }
  // the items of a CTA that walks several (walk_table_fill)
  __device__ WalkTable& walk() { return *reinterpret_cast<WalkTable*>(&a[1][0][0]); }
  static_assert(sizeof(WalkTable) <= sizeof(a[1]), "the walk table in a[1]");
};

// Where a CTA's boxes come from: q and k of its head, its value slice, from the sequence's first token.
struct GatedChunkSrc {
  const u16 *q, *k, *v;
  long long qk_stride, v_stride;
};

// Rows [0, rows) of chunk c's q, k and value slice into buffer `buf` by cp.async, one group per
// thread of the calling warpgroup; rows past `rows` are zero-filled.
template <int D>
__device__ __forceinline__ void gated_chunk_load(GatedChunkSmem<D>& sm, const GatedChunkSrc& src, int c, int rows,
                                                 int buf) {
  constexpr int C = CULA_CHUNK, N = CULA_GATED_CHAIN_THREADS;
  const int tid = threadIdx.x % N;
  const long long qk = (long long)c * C * src.qk_stride, v = (long long)c * C * src.v_stride;
  cp_async_rows<D, N, 2>({SwizzledTile{sm.q[buf], C}, SwizzledTile{sm.k[buf], C}}, {src.q + qk, src.k + qk},
                         src.qk_stride, rows, tid);
  cp_async_rows<CULA_BLOCK_V, N>(SwizzledTile{sm.v[buf], C}, src.v + v, src.v_stride, rows, tid);
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
// wgmma: all of them), and times the state copy ts (XS, with STATE; the copy holds S^T, so both
// products read their B operand k-major); with `norms`, the rows' sums of squares over the lanes of
// the quad (ss). WG (sm_90a, a whole warpgroup): the warp's rows of tx by ldmatrix are the A operand
// of the products from registers, K and the state copy read by wgmma.
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
      ldsm_a(a[kk], tx, w * 16, kk, lane);
      if (norms) add_row_squares<T>(ss, a[kk]);
    }
    const u64 dk = smem_desc(tk.base), ds = smem_desc(ts.base);
    wgmma_fence();
    if constexpr (KEYS) wgmma_regs_times_kmajor<T, D / 16, C>(&XK[0][0], a, dk);
    if constexpr (STATE) wgmma_regs_times_kmajor<T, D / 16, CULA_BLOCK_V>(&XS[0][0], a, ds);
    wgmma_commit();
    wgmma_wait<0>();
  } else {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      u32 a[4];
      ldsm_a(a, tx, w * 16, kk, lane);
      if (norms) add_row_squares<T>(ss, a);
      if constexpr (KEYS) mma_times_tile_t<T>(XK, a, tk, kk, lane, w);  // (not above the diagonal block)
      if constexpr (STATE) mma_times_tile_t<T>(XS, a, ts, kk, lane);
    }
  }
  if (norms)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) ss[hf] = quad_sum(ss[hf]);
}

// The system warpgroup's part of the delta rule for chunk c (warp w of it: rows 16 w + {g, g+8}),
// which needs no state, once chunk c's boxes and gates are in: K K^T and 1 / |k| of its rows (into
// rk), then, once the chain has solved chunk c-1 (A's buffers are free again; TWO: chunk c-2, the
// last reader of A's buffers [c % 2], see gated_two_a) and a barrier of the
// warpgroup for all rows' norms, A of its rows and the inverse of its 16-row diagonal block; then
// the chain may solve chunk c. (K K^T before the chain's hand-over, so that it runs beside the
// chain's solve of chunk c-1.)
template <typename T, int D, bool WG, bool TWO>
__device__ __forceinline__ void gated_chunk_system(GatedChunkSmem<D>& sm, int c, bool l2norm) {
  float(*const a)[CULA_CHUNK + 4] = sm.a[TWO ? c & 1 : 0];
  float(*const dinv)[CULA_DINV_PITCH] = sm.dinv[TWO ? c & 1 : 0];
  const int b = c % 3, gb = c & 3, lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const SwizzledTile tk{sm.k[b], CULA_CHUNK};
  const float* g2 = sm.g2[gb];
  float* rk = sm.rk[gb];
  float KK[8][4] = {}, unused[8][4], ss[2] = {};
  rows_times_keys_and_state<T, D, WG, true, false>(KK, unused, ss, tk, tk, tk, l2norm);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
    if (t == 0) rk[16 * w + g + 8 * hf] = l2norm ? rsqrtf(ss[hf] + 1e-6f) : 1.f;
  if (!TWO || c >= 2) handover_sync(system_bar<TWO>(c));  // A's buffers: the chain has solved chunk c-1 (c-2)
  system_sync();  // every row's norm
  float gi[2], fi[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * w + g + 8 * hf;
    gi[hf] = g2[i];
    fi[hf] = sm.beta[gb][i] * rk[i];
  }
  // The blocks up to the diagonal; no mask: the solve reads neither the diagonal blocks' entries on
  // and above the diagonal nor the blocks above it.
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    if (nt > 2 * w + 1) continue;
    const int j = nt * 8 + 2 * t;  // key token
    const float2 rj = *(const float2*)&rk[j], gj = *(const float2*)&g2[j];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float x0 = KK[nt][2 * hf] * fi[hf] * rj.x * fast_exp2(gi[hf] - gj.x),
                  x1 = KK[nt][2 * hf + 1] * fi[hf] * rj.y * fast_exp2(gi[hf] - gj.y);
      *(float2*)&a[16 * w + g + 8 * hf][j] =  // (left of the diagonal block: tf32 values, chunk_solve.cuh)
          nt < 2 * w ? make_float2(tf32_value(x0), tf32_value(x1)) : make_float2(x0, x1);
    }
  }
  __syncwarp();
  invert_diagonal_block<CULA_CHUNK + 4>(a, dinv, w, 16 * (w & 1));
  // (kept from the 32-row joins. Session 58 dropped it: racecheck reported 219 errors, and the
  // chunk was at most 1% faster, exp/s58-nosync)
  system_sync();
  handover_arrive(solve_bar<TWO>(c));  // A and the diagonal inverses of chunk c, and its rk
}

// The chain's state is S^T in registers, in the accumulator layout: warp w holds value columns
// 16 w + {g, g+8} (ST[p][4 nt + 2 hf + e]: column 16 w + g + 8 hf, key 64 p + 8 nt + 2 t + e).
// f(column, key, x) for each element.
template <int MT, typename F>
__device__ __forceinline__ void for_state_t(float (&ST)[MT][32], F f) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int p = 0; p < MT; ++p)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(16 * w + g + 8 * (e >> 1), 64 * p + 8 * nt + 2 * t + (e & 1), ST[p][4 * nt + e]);
}

// The chain's S^T from the state slice at `state` of h0 ([N, HV, D, D]; zeros without h0), and back
// into the same slice of ht (when the call asks for final states).
template <int D, int MT>
__device__ __forceinline__ void gated_load_state(float (&ST)[MT][32], const CulaGdnParams& p, long long state) {
  for_state_t(ST, [&](int col, int key, float& x) { x = p.h0 ? p.h0[state + (long long)key * D + col] : 0.f; });
}
template <int D, int MT>
__device__ __forceinline__ void gated_store_state(float (&ST)[MT][32], const CulaGdnParams& p, long long state) {
  if (p.ht_mode == CULA_HT_FINAL)
    for_state_t(ST, [&](int col, int key, float& x) { p.ht[state + (long long)key * D + col] = x; });
}

// The A operand of k-step kk (keys 16 kk .. 16 kk + 15) of S^T, in 16 bits.
template <typename T, int MT>
__device__ __forceinline__ void state_t_fragment(u32 (&a)[4], const float (&ST)[MT][32], int kk) {
  score_fragment<T>(a, reinterpret_cast<const float(&)[8][4]>(ST[kk >> 2]), kk & 3);
}

// The chain's part of the delta rule for chunk c, transposed (warp w: value columns 16 w + {g, g+8}
// of the slice, all the chunk's rows): (K S)^T = S^T K^T from the state in registers, then (once the
// system warpgroup has formed the chunk's system) X^T and the solve in registers; U^T is left in
// x for the state update, and U goes in 16 bits into u[c % 2] (by stmatrix.trans) for the output.
template <typename T, int D, bool WG, bool TWO>
__device__ __forceinline__ void gated_chunk_solve(GatedChunkSmem<D>& sm, int c, const float (&ST)[D / 64][32],
                                                  float (&x)[8][4]) {
  const int b = c % 3, gb = c & 3, lane = threadIdx.x & 31, w = threadIdx.x >> 5, t = lane & 3;
  const int li = lane >> 3, lr = lane & 7;  // the ldmatrix piece and row this lane addresses
  const SwizzledTile tk{sm.k[b], CULA_CHUNK}, tv{sm.v[b], CULA_CHUNK};
  float KS[8][4] = {};
  if constexpr (WG) {
    u32 a[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) state_t_fragment<T>(a[kk], ST, kk);
    wgmma_fence();
    wgmma_regs_times_kmajor<T, D / 16, CULA_CHUNK>(&KS[0][0], a, smem_desc(tk.base));
    wgmma_commit();
    wgmma_wait<0>();
  } else {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      u32 a[4];
      state_t_fragment<T>(a, ST, kk);
      mma_times_tile_t<T>(KS, a, tk, kk, lane);
    }
  }
  handover_sync(solve_bar<TWO>(c));  // the chunk's A, diagonal inverses and rk
  // X^T = (beta (v - exp(G) (K S) / |k|))^T: v^T's fragments by ldmatrix.trans, two 8-row tiles a call
#pragma unroll
  for (int np = 0; np < 4; ++np) {
    u32 vv[4];
    ldsm_x4_trans(vv, tv.at(16 * np + 8 * (li >> 1) + lr, 16 * w + 8 * (li & 1)));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int nt = 2 * np + h, j = 8 * nt + 2 * t;  // the lane's rows (tokens) j, j + 1
      const float2 bj = *(const float2*)&sm.beta[gb][j], rj = *(const float2*)&sm.rk[gb][j];
      const float2 gj = *(const float2*)&sm.g2[gb][j];
      const float f0 = rj.x * fast_exp2(gj.x), f1 = rj.y * fast_exp2(gj.y);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const u32 v2 = vv[2 * h + hf];
        x[nt][2 * hf] = bj.x * (to_float<T>((u16)(v2 & 0xffffu)) - f0 * KS[nt][2 * hf]);
        x[nt][2 * hf + 1] = bj.y * (to_float<T>((u16)(v2 >> 16)) - f1 * KS[nt][2 * hf + 1]);
      }
    }
  }
  solve_lower_blocks16_t<CULA_CHUNK + 4>(sm.a[TWO ? c & 1 : 0], sm.dinv[TWO ? c & 1 : 0], x);
  store_solved16<T>(SwizzledTile{sm.u[c & 1], CULA_CHUNK}, 16 * w, x);  // U in 16 bits: the operand of o
}

// Whether the one-item kernel forms chunk c's system into A's buffers [c % 2] (its system a chunk
// ahead of the chain's solve: the chain's hand-over of chunk c-2 frees them), or into [0] as the
// walking kernel does. Session 48, H200, the one-item kernel with A twice against once: sm90a D=128
// B2 T8192 H16 HV32 0.420 -> 0.412 ms (0.981), H32 HV32 0.973, B1 T32768 0.986, B1 T1024 0.983;
// but D=64 1.023 (sm90a) and 1.058 (generic), generic D=128 1.009-1.024. So only sm90a at D=128.
template <bool WG, int D>
constexpr bool gated_two_a = WG && D == 128;

// The system warpgroup: the chunks' systems, chunk c's once its boxes and gates are in.
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_chunk_systems(GatedChunkSmem<D>& sm, int nchunks, bool l2norm) {
  for (int c = 0; c < nchunks; ++c) {
    handover_sync(CULA_CHUNK_BOXES_BAR + (c & 1));  // chunk c's boxes and gates
    gated_chunk_system<T, D, WG, gated_two_a<WG, D>>(sm, c, l2norm);
  }
}

// Chunk gc's turn of the output warpgroup (warp w of it: o rows 16 w + {g, g+8}): once the chain
// hands its U over (READY), the loader told that chunk gc-1's buffers are free (FREE), when there
// is a chunk gc+2 to load into them (`ahead`); Q K^T (masked, decayed) and Q S (the state copy),
// the squared norms of the q rows, O = that + P U. The caller hands the buffers back (DONE) and
// stores O.
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_output_turn(GatedChunkSmem<D>& sm, const CulaGdnParams& p, int gc, bool ahead,
                                                  float (&O)[8][4]) {
  constexpr int C = CULA_CHUNK;
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int b = gc % 3, slot = gc & 1;
  const SwizzledTile tq{sm.q[b], C}, tk{sm.k[b], C}, ts{sm.s[slot], CULA_BLOCK_V};
  const SwizzledTile tu{sm.u[slot], C};
  const float* g2 = sm.g2[gc & 3];
  const float* rk = sm.rk[gc & 3];
  handover_sync(CULA_CHUNK_READY_BAR + slot);
  // chunk gc+2 into chunk gc-1's buffers: the chain is done with them (it solved chunk gc after its
  // state update with chunk gc-1), the system too (before chunk gc-1's solve), and so is this warpgroup
  if (ahead) handover_arrive(CULA_CHUNK_FREE_BAR + slot);
  float QK[8][4] = {}, ss[2] = {};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) O[nt][0] = O[nt][1] = O[nt][2] = O[nt][3] = 0.f;
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
    for (int kk = 0; kk < 4; ++kk) WgmmaRS<T, 1>::run(&O[0][0], af[kk], desc_at(du, mnmajor_step(kk)), 1);
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
}

// What the loader needs of chunk c of an item: where the item's boxes come from, its length, its
// first gate (bos HV + hv) and its in-kernel gate constants.
struct GatedLoadChunk {
  GatedChunkSrc src;
  long long len, gb0;
  int c;
  InGate ig;
};

// The loader's hand-over of the CTA's chunk j, chunk x.c of its item: its gates (loaded by warp 0,
// which `scans`) scanned into the buffers j % 4, its boxes waited for (at most PENDING later groups
// of this thread in flight), then both handed to the system warpgroup (BOXES) and to the chain
// (LOADED).
template <int PENDING, bool WG, int D>
__device__ __forceinline__ void gated_land(GatedChunkSmem<D>& sm, const CulaGdnParams& p, bool scans,
                                           const ChunkGates& gates, const GatedLoadChunk& x, int j) {
  if (scans) chunk_gate_scan(sm.beta[j & 3], sm.g2[j & 3], gates, p, x.ig, chunk_rows(x.len, x.c));
  cp_async_wait<PENDING>();
  if constexpr (WG) fence_async_smem();  // (wgmma operands)
  handover_arrive(CULA_CHUNK_BOXES_BAR + (j & 1));
  handover_arrive(CULA_CHUNK_LOADED_BAR + (j & 1));
}

// The loader warpgroup (both kernels): the CTA's chunks j = 0 .. total-1, chunk j's boxes (cp.async,
// all its threads) into the buffers j % 3 and its gates (warp 0: loaded a chunk ahead, scanned into
// the buffers j % 4), for the system warpgroup (BOXES) and the chain (LOADED). `at(x, j)` is the
// GatedLoadChunk of the CTA's chunk j at position x, `first` chunk 0's position, `next(x)` the
// position after x: a walking CTA's positions are (item, chunk) of its table, the item's values
// worked out from the table at each load, not held across chunks; the one-item kernel's chunk j is
// its item's chunk j, its positions empty (GatedNoPos: counters of their own spilled). Chunks
// 0 and 1 at once; chunk j + 2 once the output warpgroup has started chunk j (FREE): the chain has
// solved chunk j, so the chain and the system are done with chunk j-1's buffers, and so is the
// output warpgroup; chunk j-2, the last reader of the gate buffers (j + 2) % 4, is done everywhere.
// (On the output warpgroup, as the walking kernel had it until session 50, the loads' issue, the
// gate loads and the scan took about a third of its chunk: session 22's clock64 timeline, 2,700 of
// 6,900 cycles. Taken off it alone they gained nothing; with the system's K K^T ahead of the
// chain's hand-over, 3.5-11%: see the top of this file.)
struct GatedNoPos {};
template <int D, bool WG, typename Pos, typename At, typename Next>
__device__ __forceinline__ void gated_loader(GatedChunkSmem<D>& sm, const CulaGdnParams& p, int total, Pos first, At at,
                                             Next next) {
  constexpr int C = CULA_CHUNK;
  const int w = (threadIdx.x >> 5) & 3;
  if (total == 0) return;
  Pos box = first, gate = first;  // the next chunks whose boxes, and whose gates, load
  ChunkGates gates;
  const auto load = [&](int j) {  // (the CTA's chunk j)
    const GatedLoadChunk x = at(box, j);
    gated_chunk_load<D>(sm, x.src, x.c, chunk_rows(x.len, x.c), j % 3);
    box = next(box);
    return x;
  };
  const auto load_gates = [&](int j) {
    if (w != 0 || j >= total) return;
    const GatedLoadChunk x = at(gate, j);
    chunk_load_gates(gates, p, x.gb0, (long long)x.c * C, x.len);
    gate = next(gate);
  };
  const GatedLoadChunk x0 = load(0);
  const GatedLoadChunk x1 = total > 1 ? load(1) : x0;
  load_gates(0);
  if (total > 1) {
    gated_land<1, WG>(sm, p, w == 0, gates, x0, 0);
  } else {
    gated_land<0, WG>(sm, p, w == 0, gates, x0, 0);
  }
  load_gates(1);
  if (total > 1) gated_land<0, WG>(sm, p, w == 0, gates, x1, 1);
  load_gates(2);
  for (int j = 0; j + 2 < total; ++j) {
    handover_sync(CULA_CHUNK_FREE_BAR + (j & 1));
    const GatedLoadChunk x = load(j + 2);
    gated_land<0, WG>(sm, p, w == 0, gates, x, j + 2);
    load_gates(j + 3);  // (its latency spent waiting for the next FREE)
  }
}

// The output warpgroup of the one-item kernel (warp w of it: o rows 16 w + {g, g+8}): for each chunk
// c, once the chain warpgroup hands its U over (and with it chunk c's boxes and gates, which the
// chain waited for), Q K^T (masked, decayed) and Q S (the state copy) of chunk c, the squared norms
// of its q rows, o = that + P U, stored; chunk c-1's buffers go to the loader (FREE) as the turn
// starts, chunk c's to the chain (DONE: the state copy buffer) when the products are done.
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_chunk_output(GatedChunkSmem<D>& sm, const CulaGdnParams& p, u16* o, long long len,
                                                   long long v_stride) {
  constexpr int C = CULA_CHUNK;
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int nchunks = (int)((len + C - 1) / C);
  if (nchunks == 0) return;
  handover_arrive(CULA_CHUNK_DONE_BAR + 1);  // ("chunk -1": the chain waits on it after chunk 0)
  for (int c = 0; c < nchunks; ++c) {
    const long long tok0 = (long long)c * C;
    const int rows = chunk_rows(len, c), slot = c & 1;
    float O[8][4];
    gated_output_turn<T, D, WG>(sm, p, c, c + 2 < nchunks, O);
    handover_arrive(CULA_CHUNK_DONE_BAR + slot);  // (the accumulators hold all it still needs)
    store_o<T, 8>(o, O, tok0, 16 * w, g, t, rows, v_stride, 1.f);
  }
}

// Chunk gc's turn of the chain warpgroup (warp w: value columns 16 w + {g, g+8} of the slice), once
// the chunk's state copy is in: the solve (U goes to the output warpgroup, READY, and A's buffers
// back to the system warpgroup when a chunk follows: chunk c of nchunks is not the item's last, or
// `more` items follow), then the state update. The caller then waits until the output warpgroup is
// done with chunk gc-1 (DONE), whose state copy buffer it fills next.
template <typename T, int D, bool WG, bool TWO>
__device__ __forceinline__ void gated_chain_turn(GatedChunkSmem<D>& sm, int gc, float (&ST)[D / 64][32], int c,
                                                 int nchunks, bool more) {
  constexpr int C = CULA_CHUNK, MT = D / 64;
  const int lane = threadIdx.x & 31, t = lane & 3, b = gc % 3, slot = gc & 1;
  if constexpr (WG) fence_async_smem();  // (the state copy: a wgmma operand)
  chain_sync();  // chunk gc's state copy is in; the chain is done with chunk gc-1
  if (!TWO && gc == 0) handover_arrive(CULA_CHUNK_SYSTEM_BAR);  // A's buffers, for chunk 0's system
  float U[8][4];  // U^T: the warp's value columns x the chunk's rows
  gated_chunk_solve<T, D, WG, TWO>(sm, gc, ST, U);
  if constexpr (WG) fence_async_smem();  // (U: a wgmma operand)
  chain_sync();  // U
  // A's buffers, for chunk gc+1's system (TWO: gc+2's)
  if (TWO ? c + 2 < nchunks : c + 1 < nchunks || more) handover_arrive(system_bar<TWO>(gc + 2));
  handover_arrive(CULA_CHUNK_READY_BAR + slot);
  const float* g2 = sm.g2[gc & 3];
  const float* rk = sm.rk[gc & 3];

  // S^T <- exp(G_L) S^T + sum_j exp(G_L - G_j) u_j k_j^T (G_L: the last row's, rows past the end
  // add 0): U^T, its token columns scaled, is the A operand from registers; K (mn-major) the B.
  const float gl = g2[C - 1], dl = fast_exp2(gl);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int e = 0; e < 32; ++e) ST[mt][e] *= dl;
  u32 a[C / 16][4];
#pragma unroll
  for (int kk = 0; kk < C / 16; ++kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int nt = 2 * kk + h, j = 8 * nt + 2 * t;
      const float f0 = rk[j] * fast_exp2(gl - g2[j]), f1 = rk[j + 1] * fast_exp2(gl - g2[j + 1]);
      a[kk][2 * h] = pack2<T>(U[nt][0] * f0, U[nt][1] * f1);
      a[kk][2 * h + 1] = pack2<T>(U[nt][2] * f0, U[nt][3] * f1);
    }
    if constexpr (!WG)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        mma_times_tile_rows<T, 1>(reinterpret_cast<const u32(&)[1][4]>(a[kk]), SwizzledTile{sm.k[b] + mt * C * 64, C},
                                  kk, lane, [&](int, int n) { return &ST[mt][4 * n]; });
  }
  if constexpr (WG) {
    const u64 dk = smem_desc(sm.k[b]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        WgmmaRS<T, 1>::run(ST[mt], a[kk], desc_at(dk, mt * C * 64 + mnmajor_step(kk)), 1);
    wgmma_commit();
    wgmma_wait<0>();
  }
}

// The chain's 16-bit copy of S^T into s[slot] for a chunk's output (value columns x keys: k-major
// for Q S), key panel by panel.
template <typename T, int D>
__device__ __forceinline__ void gated_copy_state(GatedChunkSmem<D>& sm, float (&ST)[D / 64][32], int slot) {
  const int w = threadIdx.x >> 5;
#pragma unroll
  for (int mt = 0; mt < D / 64; ++mt)
    copy_stmatrix<T, 1>(reinterpret_cast<float(&)[1][32]>(ST[mt]), [w](int) { return 16 * w; },
                        SwizzledTile{sm.s[slot] + mt * CULA_BLOCK_V * 64, CULA_BLOCK_V});
}

// The chain warpgroup of the one-item kernel: the delta rule's solve and the state, chunk after
// chunk (S^T in registers: for_state_t). Chunk c's U goes to the output warpgroup as soon as it is
// solved, and A's buffers back to the system warpgroup; the state update follows, and its 16-bit
// copy for chunk c+1 waits until the output warpgroup is done with chunk c-1 (whose copy buffer it
// reuses); chunk c+1's turn, until the loader has its boxes and gates in (LOADED).
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_chunk_chain(GatedChunkSmem<D>& sm, const CulaGdnParams& p, long long len,
                                                  long long state) {
  constexpr int C = CULA_CHUNK, MT = D / 64;
  float ST[MT][32];
  gated_load_state<D>(ST, p, state);
  const auto copy_state = [&](int slot) { gated_copy_state<T, D>(sm, ST, slot); };
  const int nchunks = (int)((len + C - 1) / C);
  if (nchunks > 0) {
    copy_state(0);
    handover_sync(CULA_CHUNK_LOADED_BAR);  // chunk 0's boxes and gates
  }
  for (int c = 0; c < nchunks; ++c) {
    const int slot = c & 1;
    gated_chain_turn<T, D, WG, gated_two_a<WG, D>>(sm, c, ST, c, nchunks, false);
    // the output of chunk c-1 is done (for c = 0 the output's hand-over before its loop)
    handover_sync(CULA_CHUNK_DONE_BAR + (slot ^ 1));
    if (c + 1 < nchunks) {
      copy_state(slot ^ 1);
      handover_sync(CULA_CHUNK_LOADED_BAR + (slot ^ 1));  // chunk c+1's boxes and gates
    }
  }
  if (nchunks > 0) handover_sync(CULA_CHUNK_DONE_BAR + ((nchunks - 1) & 1));  // every arrival is met
  gated_store_state<D>(ST, p, state);
}

template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_chunk(const CulaGdnParams& p) {
  static_assert(sizeof(GatedChunkSmem<D>) + 1024 <= CULA_GATED_CHUNK_SMEM_BYTES(D), "shared memory size");
  static_assert(CULA_GDN_CHUNK_THREADS == 4 * CULA_GATED_CHAIN_THREADS && CULA_GATED_CHAIN_THREADS == 128 &&
                    CULA_BLOCK_V == 64 && CULA_CHUNK == 64,
                "four warpgroups; 4 warps of 16 rows / 16 columns each");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  GatedChunkSmem<D>& sm = GatedChunkSmem<D>::get(smem_raw);
  const int vb = blockIdx.x, hv = blockIdx.y, n = blockIdx.z, HV = p.v_heads, H = p.heads;
  long long bos, len;
  clamped_seq_bounds(p.seqs, n, p.total_tokens, bos, len);
  const long long qk_stride = (long long)H * D, v_stride = (long long)HV * D;
  const long long qk0 = qk_row_at<D>(H, HV, bos, hv), v0 = v_slice_at<D>(HV, bos, hv, vb);
  // 512 threads start with 128 registers each; the chain takes more, the loader fewest (each
  // setmaxnreg on its own branch, so that ptxas allocates the role's code with it). (Not a helper
  // taking the roles as lambdas: the closures changed this kernel's code, by 1% on B=1 T=32768;
  // gated_walk spells its four branches the same way.)
  const int role = WG ? __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0) : (int)threadIdx.x >> 7;
  if (role == 0) {
    setmaxnreg_inc<CULA_GDN_CHAIN_REGS>();
    gated_chunk_chain<T, D, WG>(sm, p, len, state_slice_at<D>(HV, n, hv, vb));
  } else if (role == 1) {
    setmaxnreg_dec<CULA_GDN_SYSTEM_REGS>();
    gated_chunk_systems<T, D, WG>(sm, (int)((len + CULA_CHUNK - 1) / CULA_CHUNK), p.l2norm != 0);
  } else if (role == 2) {
    setmaxnreg_inc<CULA_GDN_FED_OUTPUT_REGS>();
    gated_chunk_output<T, D, WG>(sm, p, (u16*)p.o + v0, len, v_stride);
  } else {
    setmaxnreg_dec<CULA_GDN_LOADER_REGS>();
    const GatedChunkSrc src{(const u16*)p.q + qk0, (const u16*)p.k + qk0, (const u16*)p.v + v0, qk_stride, v_stride};
    const InGate ig = in_gate(p, hv);
    gated_loader<D, WG>(
        sm, p, (int)((len + CULA_CHUNK - 1) / CULA_CHUNK), GatedNoPos{},
        [&](GatedNoPos, int j) { return GatedLoadChunk{src, len, bos * HV + hv, j, ig}; },
        [](GatedNoPos x) { return x; });
  }
}

// ---- the _walk kernels: CTAs that walk several items (walk_table_fill) --------------------------
//
// The host runs them for many items of few chunks (gdn_chunk_walk; a CTA an item otherwise,
// gated_chunk, whose grid is (NV, HV, N)). Both share each role's turn of a chunk (gated_output_turn
// and gated_chain_turn); the one-item kernel's SASS is kept as it was before the walk.

// The system warpgroup of a walking CTA: the systems of its items' chunks, as gated_chunk_systems.
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_walk_systems(GatedChunkSmem<D>& sm, const CulaGdnParams& p) {
  for (int gc = 0, total = walk_chunks(sm.walk()); gc < total; ++gc) {
    handover_sync(CULA_CHUNK_BOXES_BAR + (gc & 1));  // the CTA's chunk gc's boxes and gates
    gated_chunk_system<T, D, WG, false>(sm, gc, p.l2norm != 0);
  }
}

// The output warpgroup of a walking CTA: gated_chunk_output's loop over the CTA's chunks gc (buffers
// and barriers go by gc), from item to item of the table.
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_walk_output(GatedChunkSmem<D>& sm, const CulaGdnParams& p) {
  constexpr int C = CULA_CHUNK;
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const long long v_stride = (long long)p.v_heads * D;
  const WalkTable& walk = sm.walk();
  const int total = walk_chunks(walk);
  if (total == 0) return;
  handover_arrive(CULA_CHUNK_DONE_BAR + 1);  // (as gated_chunk_output)
  int j = walk_skip(walk, 0), c = 0;
  u16* o = nullptr;
  for (int gc = 0; gc < total; ++gc) {
    const WalkItem& it = walk.items[j];
    if (c == 0) {
      if (const int next = walk_skip(walk, j + 1); next < walk.count)  // (the chain's, after this item)
        walk_prefetch_state<D, CULA_GATED_CHAIN_THREADS>(p, walk.items[next], threadIdx.x % CULA_GATED_CHAIN_THREADS);
      o = (u16*)p.o + walk.v0[j];
    }
    float O[8][4];
    gated_output_turn<T, D, WG>(sm, p, gc, gc + 2 < total, O);
    handover_arrive(CULA_CHUNK_DONE_BAR + (gc & 1));  // (the accumulators hold all it still needs)
    store_o<T, 8>(o, O, (long long)c * C, 16 * w, g, t, chunk_rows(it.len, c), v_stride, 1.f);
    if (++c == it.nchunks) j = walk_skip(walk, j + 1), c = 0;
  }
}

// The chain warpgroup of a walking CTA: gated_chunk_chain's turns, item after item (each after
// the loader's LOADED, as there); after an item's last chunk it stores the item's final state and
// copies the next item's initial one for the output in place of the updated state. One loop over
// the CTA's chunks, as the other roles' (in a loop over items and one over their chunks, ptxas
// worked out the solve's shared-memory addresses anew each chunk: 186 -> 240 SASS instructions a
// warp and chunk, session 52).
template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_walk_chain(GatedChunkSmem<D>& sm, const CulaGdnParams& p) {
  float ST[D / 64][32];
  const WalkTable& walk = sm.walk();
  const auto load_state = [&](const WalkItem& it) { gated_load_state<D>(ST, p, walk_state_at<D>(p, it)); };
  const auto store_state = [&](const WalkItem& it) { gated_store_state<D>(ST, p, walk_state_at<D>(p, it)); };
  const int total = walk_chunks(walk);
  if (total == 0) return;
  int item = walk_skip(walk, 0), next = walk_skip(walk, item + 1), nchunks = walk.items[item].nchunks, c = 0;
  load_state(walk.items[item]);
  gated_copy_state<T, D>(sm, ST, 0);
  handover_sync(CULA_CHUNK_LOADED_BAR);  // chunk 0's boxes and gates
  for (int gc = 0; gc < total; ++gc) {
    const int slot = gc & 1;
    gated_chain_turn<T, D, WG, false>(sm, gc, ST, c, nchunks, next < walk.count);
    handover_sync(CULA_CHUNK_DONE_BAR + (slot ^ 1));  // (as gated_chunk_chain)
    if (++c < nchunks) {
      gated_copy_state<T, D>(sm, ST, slot ^ 1);
    } else {
      store_state(walk.items[item]);
      if (next < walk.count) {
        item = next;
        next = walk_skip(walk, item + 1);
        nchunks = walk.items[item].nchunks;
        c = 0;
        load_state(walk.items[item]);
        gated_copy_state<T, D>(sm, ST, slot ^ 1);
      }
    }
    if (gc + 1 < total) handover_sync(CULA_CHUNK_LOADED_BAR + (slot ^ 1));  // chunk gc+1's boxes and gates
  }
  handover_sync(CULA_CHUNK_DONE_BAR + ((total - 1) & 1));  // every arrival is met
}

template <typename T, int D, bool WG>
__device__ __forceinline__ void gated_walk(const CulaGdnParams& p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  GatedChunkSmem<D>& sm = GatedChunkSmem<D>::get(smem_raw);
  walk_table_fill<D, CULA_GDN_CHUNK_THREADS>(sm.walk(), p);
  const int role = WG ? __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0) : (int)threadIdx.x >> 7;
  if (role == 0) {  // (the roles' registers by variant: CULA_GDN_WALK_REGS)
    setmaxnreg_inc<CULA_GDN_WALK_REGS(WG, 0)>();
    gated_walk_chain<T, D, WG>(sm, p);
  } else if (role == 1) {
    setmaxnreg_dec<CULA_GDN_WALK_REGS(WG, 1)>();
    gated_walk_systems<T, D, WG>(sm, p);
  } else if (role == 2) {
    setmaxnreg_inc<CULA_GDN_WALK_REGS(WG, 2)>();
    gated_walk_output<T, D, WG>(sm, p);
  } else {
    setmaxnreg_dec<CULA_GDN_WALK_REGS(WG, 3)>();
    const WalkTable& walk = sm.walk();
    const int HV = p.v_heads;
    const long long qk_stride = (long long)p.heads * D, v_stride = (long long)HV * D;
    gated_loader<D, WG>(
        sm, p, walk_chunks(walk), walk_first(walk),
        [&](WalkPos x, int) {
          const WalkItem& it = walk.items[x.j];
          const long long qk0 = walk.qk0[x.j];
          const GatedChunkSrc src{(const u16*)p.q + qk0, (const u16*)p.k + qk0, (const u16*)p.v + walk.v0[x.j],
                                  qk_stride, v_stride};
          return GatedLoadChunk{src, it.len, it.bos * HV + it.hv, x.c, in_gate(p, it.hv)};
        },
        [&](WalkPos x) { return walk_next(walk, x); });
  }
}

// The entry points of the chunked gated kernel (extern "C", looked up by name from the host): NAME
// by mma.sync (every target), NAME_sm90a by wgmma (its body in the sm_90a cubin only), a CTA an
// item; NAME_walk and NAME_walk_sm90a the same with CTAs that walk several (gated_walk).
#define CULA_GATED_CHUNK_ENTRY(NAME, BODY, THREADS, T, D)                                              \
  extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME(const __grid_constant__ CulaGdnParams p) { \
    BODY<T, D, false>(p);                                                                             \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                            \
      NAME##_sm90a(const __grid_constant__ CulaGdnParams p) {                                         \
    CULA_SM90A_ONLY((BODY<T, D, true>(p)));                                                           \
  }
#define CULA_GATED_CHUNK_KERNEL(NAME, T, D)                                   \
  CULA_GATED_CHUNK_ENTRY(NAME, gated_chunk, CULA_GDN_CHUNK_THREADS, T, D)     \
  CULA_GATED_CHUNK_ENTRY(NAME##_walk, gated_walk, CULA_GDN_CHUNK_THREADS, T, D)
