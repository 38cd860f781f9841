// The delta rule's triangular solve within a chunk, shared by the chunked kernels of the delta-rule
// families (common/chunk_gated.cuh, common/chunk_kda.cuh): (I + A) U = X for a strictly lower
// triangular A of CULA_CHUNK = 64 rows, warp-level tf32 mma.sync. Compiled by NVRTC (no CUDA
// headers). By blocks of 16 rows:
// 1. One warp per 16-row diagonal block w of I + A inverts it by forward substitution in fp32
//    (invert_diagonal_block: rows 16 w .. 16 w + 15, columns 16 (w & 1) of dinv).
// 2. After a barrier, U_i = D_i Y_i and Y_j -= A_ji U_i for the blocks j > i (D_i the inverses,
//    Y_0 = X_0), transposed, on 16 columns of X held in registers by the calling warp
//    (solve_lower_blocks16_t; from X in shared memory: solve_columns): 36 mma, 14 dependent, and no
//    shared-memory round trip.
// Sessions 19-56 (and the prep kernel's until session 58) solved by blocks of 32 rows, their
// inverses joined from the 16-row ones by two more warps' tf32 products after a barrier: 12
// dependent mma in the solve, and a phase and a barrier before it (notes/gated-delta-rule.md).
#pragma once

#include "common/frags.cuh"
#include "common/ptx.cuh"
#include "common/tma.cuh"

#define CULA_DINV_PITCH 36  // floats per row of the diagonal inverses (two 16-column blocks side by side + 4)

// The tf32 operands are stored rounded: the inverses (invert_diagonal_block) and, by the caller,
// A's entries left of its 16-row diagonal blocks (those read by the products here; the diagonal
// blocks stay fp32 for invert_diagonal_block) hold tf32_value of the float, so that each of the 16
// warps of a solve passes the bits as they are where each converted them.
__device__ __forceinline__ float tf32_value(float x) { return __uint_as_float(to_tf32(x)); }

// The calling warp: the inverse of diagonal block w (0..3) of I + A (a: row pitch AP floats, a
// multiple of 4, 16-byte aligned) into dinv rows 16 w .. 16 w + 15, columns col0 .. col0 + 15; lane
// c (and c + 16) computes column c. Row r's entries left of the diagonal are read 4 at a time (36
// broadcast loads for the block where one a float took 120).
template <int AP>
__device__ __forceinline__ void invert_diagonal_block(const float (*a)[AP], float (*dinv)[CULA_DINV_PITCH], int w,
                                                      int col0) {
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
    for (int r = 0; r < 16; ++r) dinv[r0 + r][col0 + c] = tf32_value(col[r]);
}

// The m16n8k8 A fragment of k-step ks from the accumulator of an m16n8 product (x[ks]), times sign:
// lane t's columns 2 t, 2 t + 1 as its k-slots t and t + 4 (a permutation the B fragments follow).
__device__ __forceinline__ void tf32_frag_t(u32 (&f)[4], const float (&acc)[4], float sign) {
  f[0] = to_tf32(sign * acc[0]);
  f[1] = to_tf32(sign * acc[2]);
  f[2] = to_tf32(sign * acc[1]);
  f[3] = to_tf32(sign * acc[3]);
}

// The calling warp: U^T (16 rows: the warp's columns of U, 64 columns: the chunk's rows) for
// (I + A) U = X, in registers: X^T in, U^T out in x (the accumulator layout of an m16n8 product:
// x[nt] holds rows g, g+8 and columns 8 nt + 2 t, + 1), from the 16-row diagonal inverses D_i of
// invert_diagonal_block (block i at rows 16 i.., columns 16 (i & 1).. of dinv) and A (row pitch AP,
// tf32 values left of its 16-row diagonal blocks): for i = 0..3, U_i^T = Y_i^T D_i^T, then Y_j^T -=
// U_i^T A_ji^T for the blocks j > i. The transposed product keeps U where the next product's A
// operand wants it: an accumulator's n-tile is the A fragment of a k-step with the k-step's columns
// permuted (tf32_frag_t), so the B fragments are read in that order: b0, b1 = M[i][8 ks + 2 t],
// M[i][8 ks + 2 t + 1] for B = M^T.
template <int AP>
__device__ __forceinline__ void solve_lower_blocks16_t(const float (*a)[AP], const float (*dinv)[CULA_DINV_PITCH],
                                                       float (&x)[8][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u32 f[2][4];
    tf32_frag_t(f[0], x[2 * i], 1.f);
    tf32_frag_t(f[1], x[2 * i + 1], 1.f);
    float u[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
      for (int ni = ks; ni < 2; ++ni) {
        const float2 b = *(const float2*)&dinv[16 * i + 8 * ni + g][16 * (i & 1) + 8 * ks + 2 * t];
        mma_tf32(u[ni], f[ks], __float_as_uint(b.x), __float_as_uint(b.y));
      }
#pragma unroll
    for (int e = 0; e < 4; ++e) x[2 * i][e] = u[0][e], x[2 * i + 1][e] = u[1][e];
    if (i == 3) break;
    tf32_frag_t(f[0], u[0], -1.f);
    tf32_frag_t(f[1], u[1], -1.f);
#pragma unroll
    for (int j = i + 1; j < 4; ++j)
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
          const float2 b = *(const float2*)&a[16 * j + 8 * ni + g][16 * i + 8 * ks + 2 * t];
          mma_tf32(x[2 * j + ni], f[ks], __float_as_uint(b.x), __float_as_uint(b.y));
        }
  }
}

// U^T of solve_lower_blocks16_t (x: rows g, g + 8 of U^T are columns c0 + g, c0 + 8 + g of U;
// columns 8 nt + 2 t, + 1 are its rows) into columns c0 .. c0 + 15 of a 16-bit tile of U's rows, by
// stmatrix.trans (each 8 x 8 piece transposed: the lane's pair of rows lands in one column).
template <typename T>
__device__ __forceinline__ void store_solved16(const SwizzledTile& tile, int c0, const float (&x)[8][4]) {
  const int lane = threadIdx.x & 31, li = lane >> 3, lr = lane & 7;  // the piece and row this lane addresses
#pragma unroll
  for (int np = 0; np < 4; ++np) {
    const u32 r[4] = {pack2<T>(x[2 * np][0], x[2 * np][1]), pack2<T>(x[2 * np][2], x[2 * np][3]),
                      pack2<T>(x[2 * np + 1][0], x[2 * np + 1][1]), pack2<T>(x[2 * np + 1][2], x[2 * np + 1][3])};
    stmatrix_x4_trans(tile.at(16 * np + 8 * (li >> 1) + lr, c0 + 8 * (li & 1)), r);
  }
}

// The calling warp: columns c0 .. c0 + 15 of U for (I + A) U = X with X in shared memory (float32
// boxes of 32 columns, 128-byte swizzle: a warp's loads and stores of X^T hit 32 banks; with
// `identity`, X = I, not read), by solve_lower_blocks16_t: U^T in the accumulator layout, xt[nt][e]
// = U[8 nt + 2 t + (e & 1)][c0 + g + 8 (e >> 1)]; at: the addresses of those columns' rows 2 t + (e & 1).
template <int AP>
__device__ __forceinline__ void solve_columns_t(const float (*a)[AP], const float (*dinv)[CULA_DINV_PITCH],
                                                const SwizzledTileF32& x, int c0, bool identity, float (&xt)[8][4],
                                                u32 (&at)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const auto row = [&](int nt, int e) { return 8 * nt + 2 * t + (e & 1); };
  const auto col = [&](int e) { return c0 + g + 8 * (e >> 1); };
  // (rows 8 apart: 8 rows of 128 bytes apart in shared memory, the swizzle the same)
  at[0] = x.at(row(0, 0), col(0)), at[1] = x.at(row(0, 1), col(1)), at[2] = x.at(row(0, 2), col(2));
  at[3] = x.at(row(0, 3), col(3));
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) xt[nt][e] = identity ? (row(nt, e) == col(e) ? 1.f : 0.f) : lds_f32(at[e] + 1024 * nt);
  solve_lower_blocks16_t<AP>(a, dinv, xt);
}
// ... U replaces those columns of X
template <int AP>
__device__ __forceinline__ void solve_columns(const float (*a)[AP], const float (*dinv)[CULA_DINV_PITCH],
                                              const SwizzledTileF32& x, int c0, bool identity) {
  float xt[8][4];
  u32 at[4];
  solve_columns_t<AP>(a, dinv, x, c0, identity, xt, at);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) sts_f32(at[e] + 1024 * nt, xt[nt][e]);
}
// ... U in 16 bits (T) into columns c0 .. c0 + 15 of `out`, a tile of U's rows (X is left as it was)
template <typename T, int AP>
__device__ __forceinline__ void solve_columns_16(const float (*a)[AP], const float (*dinv)[CULA_DINV_PITCH],
                                                 const SwizzledTileF32& x, int c0, const SwizzledTile& out) {
  float xt[8][4];
  u32 at[4];
  solve_columns_t<AP>(a, dinv, x, c0, false, xt, at);
  store_solved16<T>(out, c0, xt);
}
