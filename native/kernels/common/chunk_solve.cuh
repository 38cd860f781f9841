// The delta rule's triangular solve within a chunk, shared by the chunked kernels of the delta-rule
// families (common/chunk_gated.cuh, common/chunk_kda.cuh): (I + A) U = X for a strictly lower
// triangular A of CULA_CHUNK = 64 rows, warp-level tf32 mma.sync. Compiled by NVRTC (no CUDA
// headers).
//
// By blocks of 16 rows:
// 1. One warp per diagonal block w of I + A inverts it by forward substitution in fp32
//    (invert_diagonal_block: dinv rows 16 w .. 16 w + 15).
// 2. After a barrier, block row r = 0..3: U_r = dinv_r (X_r - sum_{m<r} A_rm U_m), each warp for its
//    own columns of X (solve_lower_blocks: as many warps as there are, from thread 0 on), so no
//    barrier across warps: 20 dependent mma and 8 shared-memory round trips a warp.
// By blocks of 32 rows (solve_lower_blocks32_t, for a solve on the critical path):
// 1. The 16-row inverses as above (at columns 16 (w & 1) of their rows), then, after a barrier, the
//    32-row ones from them: [D0 0; L D1] with L = -D1 A10 D0 (join_diagonal_inverses: two 16 x 16
//    products in tf32, two warps per 32-row block).
// 2. U0 = B0 X0, Y1 = X1 - A10 U0, U1 = B1 Y1 (B0, B1 the 32-row inverses, A10 rows 32..63 by
//    columns 0..31 of A), transposed, on 16 columns of X held in registers by the calling warp:
//    12 dependent mma and no shared-memory round trip.
#pragma once

#include "common/ptx.cuh"

#define CULA_DINV_PITCH 20    // floats per row of the 16-row diagonal inverses (16 + 4: fragment loads hit 32 banks)
#define CULA_DINV32_PITCH 36  // and of the 32-row ones (32 + 4)

// The calling warp: the inverse of diagonal block w (0..3) of I + A (a: row pitch AP floats, a
// multiple of 4, 16-byte aligned) into dinv rows 16 w .. 16 w + 15, columns col0 .. col0 + 15; lane
// c (and c + 16) computes column c. Row r's entries left of the diagonal are read 4 at a time (36
// broadcast loads for the block where one a float took 120).
template <int AP, int DP = CULA_DINV_PITCH>
__device__ __forceinline__ void invert_diagonal_block(const float (*a)[AP], float (*dinv)[DP], int w, int col0 = 0) {
  static_assert(AP % 4 == 0, "rows of whole float4s");
  const int lane = threadIdx.x & 31, c = lane & 15, r0 = 16 * w;
  float col[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    float acc = r == c ? 1.f : 0.f;
#pragma unroll
    for (int q = 0; q < (r + 3) / 4; ++q) {
      const float4 x = *(const float4*)&a[r0 + r][r0 + 4 * q];
      const float e[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int j = 4 * q; j < 4 * q + 4 && j < r; ++j) acc -= e[j - 4 * q] * col[j];
    }
    col[r] = acc;
  }
  if (lane < 16)
#pragma unroll
    for (int r = 0; r < 16; ++r) dinv[r0 + r][col0 + c] = col[r];
}

// Tf32 operands of the m16n8k8 A fragment (ptx.cuh, mma_tf32) at rows r0 + {g, g+8}, columns
// c0 + {t, t+4} of a float matrix, negated with NEG.
template <bool NEG = false, int P>
__device__ __forceinline__ void tf32_rows(u32 (&f)[4], const float (*m)[P], int r0, int c0, int g, int t) {
  const auto at = [&](int r, int c) { return to_tf32(NEG ? -m[r][c] : m[r][c]); };
  f[0] = at(r0 + g, c0 + t);
  f[1] = at(r0 + g + 8, c0 + t);
  f[2] = at(r0 + g, c0 + t + 4);
  f[3] = at(r0 + g + 8, c0 + t + 4);
}

// The calling warp: columns 8 h .. 8 h + 7 (h = 0, 1) of the lower left block L = -D1 A10 D0 of the
// 32-row inverse r (0..1) of I + A, from its two 16-row ones, which invert_diagonal_block put at
// rows 32 r + {0..15, 16..31} of binv, columns {0, 16}; L goes to rows 32 r + 16 .. 32 r + 31,
// columns 0..15. (Two warps per block, one for each half: the same latency as one warp for both.)
// P = D1 A10 stays in registers: its accumulator fragments are the A fragments of P D0 with the
// k-steps' columns permuted (lane t holds columns 2 t, 2 t + 1), so D0's rows are read in that order.
template <int AP>
__device__ __forceinline__ void join_diagonal_inverses(const float (*a)[AP], float (*binv)[CULA_DINV32_PITCH], int r,
                                                       int h) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r0 = 32 * r;
  float P[2][4] = {};
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    u32 f[4];
    tf32_rows(f, binv, r0 + 16, 16 + 8 * ks, g, t);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
      mma_tf32(P[nt], f, to_tf32(a[r0 + 16 + 8 * ks + t][r0 + 8 * nt + g]),
               to_tf32(a[r0 + 16 + 8 * ks + t + 4][r0 + 8 * nt + g]));
  }
  float L[4] = {};
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    if (ks < h) continue;  // D0 is lower triangular: its rows 0..7 are zero in columns 8..15
    const u32 f[4] = {to_tf32(-P[ks][0]), to_tf32(-P[ks][2]), to_tf32(-P[ks][1]), to_tf32(-P[ks][3])};
    mma_tf32(L, f, to_tf32(binv[r0 + 8 * ks + 2 * t][8 * h + g]), to_tf32(binv[r0 + 8 * ks + 2 * t + 1][8 * h + g]));
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
    *(float2*)&binv[r0 + 16 + g + 8 * hf][8 * h + 2 * t] = make_float2(L[2 * hf], L[2 * hf + 1]);
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
        u32 f[4];
        tf32_rows<true>(f, a, 16 * r, kc, g, t);
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
      u32 f[4];
      tf32_rows(f, dinv, 16 * r, kc, g, t);
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

// The calling warp: U^T (16 rows: the warp's columns of U, 64 columns: the chunk's rows) for
// (I + A) U = X by blocks of 32 rows, in registers: X^T in, U^T out in x (the accumulator layout of
// an m16n8 product: x[nt] holds rows g, g+8 and columns 8 nt + 2 t, + 1), from the 32-row inverses
// of join_diagonal_inverses in binv and A (row pitch AP floats):
//   U0^T = X0^T B0^T,  Y1^T = X1^T - U0^T A10^T,  U1^T = Y1^T B1^T
// by tf32 mma, 12 dependent ones on the longest path and no shared-memory round trip (the
// transposed product keeps U where the next product's A operand wants it; only A and the inverses
// are read, by float2). An accumulator's n-tile is the A fragment of a k-step with the k-step's
// columns permuted (lane t holds columns 2 t, 2 t + 1 as its k-slots t and t + 4), so the B
// fragments are read in that order: b0, b1 = M[i][8 ks + 2 t], M[i][8 ks + 2 t + 1] for B = M^T.
template <int AP>
__device__ __forceinline__ void solve_lower_blocks32_t(const float (*a)[AP], const float (*binv)[CULA_DINV32_PITCH],
                                                       float (&x)[8][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const auto a_frag = [](u32 (&f)[4], const float (&acc)[4], float sign) {
    f[0] = to_tf32(sign * acc[0]);
    f[1] = to_tf32(sign * acc[2]);
    f[2] = to_tf32(sign * acc[1]);
    f[3] = to_tf32(sign * acc[3]);
  };
  // y[ni] += sign * z[ks] times the transpose of the 32 x 32 block of M at m (row pitch `pitch`),
  // over k-steps ks and n-tiles ni (of 4): b0, b1 = m[(8 ni + g) pitch + 8 ks + 2 t + {0, 1}]. LOWER:
  // a 32-row inverse, whose 8 x 8 blocks past the diagonal are skipped: zero, and for its rows 0..15
  // the columns 16..31 are never written.
  const auto times_t = [&](float (&y)[4][4], const float (&z)[4][4], const float* m, int pitch, float sign,
                           bool lower) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      u32 f[4];
      a_frag(f, z[ks], sign);
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        if (lower && ks > ni) continue;
        const float2 b = *(const float2*)&m[(8 * ni + g) * pitch + 8 * ks + 2 * t];
        mma_tf32(y[ni], f, to_tf32(b.x), to_tf32(b.y));
      }
    }
  };
  float x0[4][4], x1[4][4], u0[4][4] = {}, u1[4][4] = {};
#pragma unroll
  for (int ni = 0; ni < 4; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) x0[ni][e] = x[ni][e], x1[ni][e] = x[4 + ni][e];
  times_t(u0, x0, &binv[0][0], CULA_DINV32_PITCH, 1.f, true);   // U0^T
  times_t(x1, u0, &a[32][0], AP, -1.f, false);                  // Y1^T
  times_t(u1, x1, &binv[32][0], CULA_DINV32_PITCH, 1.f, true);  // U1^T
#pragma unroll
  for (int ni = 0; ni < 4; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[ni][e] = u0[ni][e], x[4 + ni][e] = u1[ni][e];
}
