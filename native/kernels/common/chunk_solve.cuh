// The delta rule's triangular solve within a chunk, shared by the chunked kernels of the delta-rule
// families (common/chunk_gated.cuh, common/chunk_kda.cuh): (I + A) U = X for a strictly lower
// triangular A of CULA_CHUNK = 64 rows, by blocks of 16 rows, warp-level tf32 mma.sync. Compiled by
// NVRTC (no CUDA headers).
//
// 1. One warp per diagonal block w of I + A inverts it by forward substitution in fp32
//    (invert_diagonal_block: dinv rows 16 w .. 16 w + 15).
// 2. After a barrier, block row r = 0..3: U_r = dinv_r (X_r - sum_{m<r} A_rm U_m), each warp for its
//    own columns of X (solve_lower_blocks: as many warps as there are, from thread 0 on), so no
//    barrier across warps.
#pragma once

#include "common/ptx.cuh"

#define CULA_DINV_PITCH 20  // floats per row of the diagonal inverses (16 + 4: fragment loads hit 32 banks)

// The calling warp: the inverse of diagonal block w (0..3) of I + A (a: row pitch AP floats) into
// dinv rows 16 w .. 16 w + 15; lane c (and c + 16) computes column c.
template <int AP>
__device__ __forceinline__ void invert_diagonal_block(const float (*a)[AP], float (*dinv)[CULA_DINV_PITCH], int w) {
  const int lane = threadIdx.x & 31, c = lane & 15, r0 = 16 * w;
  float col[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    float acc = r == c ? 1.f : 0.f;
#pragma unroll
    for (int j = 0; j < r; ++j) acc -= a[r0 + r][r0 + j] * col[j];
    col[r] = acc;
  }
  if (lane < 16)
#pragma unroll
    for (int r = 0; r < 16; ++r) dinv[r0 + r][c] = col[r];
}

// Warp w (of the CTA): columns [8 NT w, 8 NT (w + 1)) of U for (I + A) U = X (A, the diagonal inverses and X in
// shared memory, X with row pitch XP floats), block row after block row; U replaces X there (the
// later block rows read it) and emit(row, col, u0, u1) receives each pair of U at (row, col..col+1).
template <int NT, int AP, int XP, typename Emit>
__device__ __forceinline__ void solve_lower_blocks(const float (*a)[AP], const float (*dinv)[CULA_DINV_PITCH],
                                                   float (*x)[XP], Emit emit) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, cw = 8 * NT * w;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    float Y[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float2 v = *(const float2*)&x[16 * r + g + 8 * hf][cw + nt * 8 + 2 * t];
        Y[nt][2 * hf] = v.x;
        Y[nt][2 * hf + 1] = v.y;
      }
#pragma unroll
    for (int m = 0; m < r; ++m)
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const int kc = 16 * m + 8 * ks;
        const u32 f[4] = {to_tf32(-a[16 * r + g][kc + t]), to_tf32(-a[16 * r + g + 8][kc + t]),
                          to_tf32(-a[16 * r + g][kc + t + 4]), to_tf32(-a[16 * r + g + 8][kc + t + 4])};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          mma_tf32(Y[nt], f, to_tf32(x[kc + t][cw + nt * 8 + g]), to_tf32(x[kc + t + 4][cw + nt * 8 + g]));
      }
    __syncwarp();  // every lane has read X_r
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        *(float2*)&x[16 * r + g + 8 * hf][cw + nt * 8 + 2 * t] = make_float2(Y[nt][2 * hf], Y[nt][2 * hf + 1]);
    __syncwarp();
    float U[NT][4] = {};
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const int kc = 8 * ks;
      const u32 f[4] = {to_tf32(dinv[16 * r + g][kc + t]), to_tf32(dinv[16 * r + g + 8][kc + t]),
                        to_tf32(dinv[16 * r + g][kc + t + 4]), to_tf32(dinv[16 * r + g + 8][kc + t + 4])};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        mma_tf32(U[nt], f, to_tf32(x[16 * r + kc + t][cw + nt * 8 + g]),
                 to_tf32(x[16 * r + kc + t + 4][cw + nt * 8 + g]));
    }
    __syncwarp();  // every lane has read Y
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = 16 * r + g + 8 * hf, col = cw + nt * 8 + 2 * t;
        *(float2*)&x[row][col] = make_float2(U[nt][2 * hf], U[nt][2 * hf + 1]);
        emit(row, col, U[nt][2 * hf], U[nt][2 * hf + 1]);
      }
    __syncwarp();
  }
}
